#!/bin/bash
# experts-int8 without installing the package (the GPU box has none installed): PYTHONPATH=src.
# CHAIN_PAD_I=1 turns the register form's PAD_I on first (s42a.sh: once its GPU tests pass, before its commit).
exec python3 -c "import os, sys
if os.environ.get('CHAIN_PAD_I'):
    from experts_int8.kernels import gluon_wsrr; gluon_wsrr.PAD_I = True
from experts_int8.cli import main; sys.argv[0] = 'experts-int8'; main()" "$@"
