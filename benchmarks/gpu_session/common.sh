# Sourced by the chain scripts (start.sh runs them with the results folder as $1): the results folder,
# the library on PYTHONPATH, the tables' folder, the log, and a timestamped step header.
R=$1
export PYTHONPATH=$PWD/src
export PYTHONUNBUFFERED=1  # a step cut by its timeout keeps the lines it printed (the 1440 tune lost them all)
# Every device call copies the working tree over the device's again, tracked tables included, so a
# chain that outlives its first call must not keep its folds in the tree (NOTES item 137): the shipped
# tables are copied to a folder of the chain's own that get_config reads first (the user cache), and
# folds and configs.tgz use that copy. Extract configs.tgz into src/experts_int8/kernels/configs.
export EXPERTS_INT8_CACHE=$R/cache
D=$EXPERTS_INT8_CACHE/configs
tables_tgz() { tar czf "$R/configs.tgz" -C "$D" .; }
if [ -n "$CHAIN_NESTED" ]; then
  # a step of another chain (s31.sh): keep its tables and its log, less this script's end marker
  exec > >(grep --line-buffered -v '^CHAIN_DONE$' >>"$R/chain.log") 2>&1
else
  rm -rf "$D" && mkdir -p "$D" && cp src/experts_int8/kernels/configs/*.json "$D"/
  : >"$R/chain.log"; exec >>"$R/chain.log" 2>&1  # appended to, so that nested steps' lines interleave in order
fi
step() { echo "=== $1 ($(date +%T))"; }
# retune DIR SPEC...: each SPEC (`experts-int8 tune --shape` arguments: the shape, --m, --budget-s) tuned into
# the fresh folder DIR, exported as $RETUNED_TABLES for `variant_ab.py retuned` to time against the tables;
# the weight format from $TUNE_DTYPES (int8 unless set)
retune() {
  export RETUNED_TABLES=$1; shift
  rm -rf "$RETUNED_TABLES" && mkdir -p "$RETUNED_TABLES"
  for spec in "$@"; do
    step "tune $spec"; timeout 200 bash benchmarks/gpu_session/cli.sh tune --shape $spec --dtypes ${TUNE_DTYPES:-int8} \
      --out-dir "$RETUNED_TABLES" --no-progress 2>&1 | grep -E "(int8|bf16) M=|took|Error|error"
  done
}
# ab VARIANT DIR ARGS...: `variant_ab.py VARIANT ARGS` with its results in $R/DIR, then its winners folded into
# the chain's tables (fold_ab.py, 1% floor); a re-tune is the variant `retuned` (after `retune`)
ab() {
  mkdir -p "$R/$2"; step "A/B $1 $2"
  timeout 450 python3 benchmarks/variant_ab.py "$1" --out "$R/$2" "${@:3}" 2>&1 | grep -v -i warn
  step "fold $2"; python3 benchmarks/fold_ab.py "$R/$2/variant_ab_$1.json" --out-dir $D --min-gain 0.01
}
