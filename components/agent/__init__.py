"""The on-machine node agent: stdlib-only Python modules the node steps run with the machine's own python3 (3.10+).

Each module is copied to the machine alone, next to the step's script, and run as ``python3 <module>.py ...``:
none imports another module of this package.
"""
