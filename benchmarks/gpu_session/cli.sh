#!/bin/bash
# experts-int8 without installing the package (the GPU box has none installed): PYTHONPATH=src.
exec python3 -c "import sys; from experts_int8.cli import main; sys.argv[0] = 'experts-int8'; main()" "$@"
