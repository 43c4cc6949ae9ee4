# Sourced by the chain scripts (start.sh runs them with the results folder as $1): the results folder,
# the library on PYTHONPATH, the shipped tables' folder, the log, and a timestamped step header.
R=$1
export PYTHONPATH=$PWD/src
D=src/experts_int8/kernels/configs
exec >"$R/chain.log" 2>&1
step() { echo "=== $1 ($(date +%T))"; }
