"""tools/tools.sh: builds each recipe once into the cache, skips it while its recipe and outputs are unchanged, and
rebuilds it when the recipe changes or an output is gone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support import ROOT

RECIPE = """VERSION={version}
PROVIDES="hello"
build() {{ echo built >> "{log}"; printf '#!/bin/sh\\necho {version}\\n' > "$OUT/hello"; chmod +x "$OUT/hello"; }}
"""


def _tools(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGC_TOOLS_DIR": str(tmp_path / "cache"), "PGC_TOOLS_RECIPES": str(tmp_path / "recipes")}
    return subprocess.run(
        ["bash", str(ROOT / "tools" / "tools.sh"), *args], check=False, capture_output=True, text=True, env=env
    )


def test_a_recipe_builds_once_and_again_only_when_it_or_its_output_changes(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    log = tmp_path / "log"
    recipe = tmp_path / "recipes" / "hello.sh"
    recipe.write_text(RECIPE.format(version="1", log=log))
    for _ in range(2):
        assert _tools(tmp_path, "build").returncode == 0
    assert log.read_text() == "built\n"
    hello = tmp_path / "cache" / "bin" / "hello"
    assert subprocess.run([hello], check=False, capture_output=True, text=True).stdout == "1\n"
    recipe.write_text(RECIPE.format(version="2", log=log))
    assert _tools(tmp_path, "build", "hello").returncode == 0
    assert subprocess.run([hello], check=False, capture_output=True, text=True).stdout == "2\n"
    hello.unlink()
    assert _tools(tmp_path, "build").returncode == 0
    assert log.read_text() == "built\n" * 3 and hello.exists()
    assert len(list((tmp_path / "cache" / "stamps").iterdir())) == 1


def test_a_recipe_that_does_not_produce_what_it_provides_fails_the_build(tmp_path: Path) -> None:
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "broken.sh").write_text('VERSION=1\nPROVIDES="nothing"\nbuild() { :; }\n')
    r = _tools(tmp_path, "build")
    assert r.returncode == 1 and "broken did not produce bin/nothing" in r.stderr
    assert not list((tmp_path / "cache" / "stamps").iterdir())
    assert _tools(tmp_path, "build", "absent").returncode == 2


def test_a_failing_command_stops_the_recipe_even_when_it_later_produces_its_output(tmp_path: Path) -> None:
    # (A go get that fails, then a go build that resolves something else and succeeds: the build must fail there.)
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "half.sh").write_text(
        'VERSION=1\nPROVIDES="hello"\n'
        'build() { echo "fetching" >&2; false; printf "#!/bin/sh\\n" > "$OUT/hello"; chmod +x "$OUT/hello"; }\n'
    )
    r = _tools(tmp_path, "build")
    assert r.returncode == 1 and "tools: half failed" in r.stderr and "fetching" in r.stderr, r.stderr
    assert not (tmp_path / "cache" / "bin" / "hello").exists()
    assert not list((tmp_path / "cache" / "stamps").iterdir())


def test_path_prints_the_cache_outside_the_clone(tmp_path: Path) -> None:
    r = _tools(tmp_path, "path")
    assert r.stdout.strip() == str(tmp_path / "cache")
    default = subprocess.run(
        ["bash", str(ROOT / "tools" / "tools.sh"), "path"],
        check=True,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PGC_TOOLS_DIR"},
    )
    assert not Path(default.stdout.strip()).is_relative_to(ROOT)
