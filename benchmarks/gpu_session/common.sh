# Sourced by the chain scripts (start.sh runs them with the results folder as $1): the results folder,
# the library on PYTHONPATH, the tables' folder, the log, and a timestamped step header.
R=$1
export PYTHONPATH=$PWD/src
# Every device call copies the working tree over the device's again, tracked tables included, so a
# chain that outlives its first call must not keep its folds in the tree (NOTES item 137): the shipped
# tables are copied to a folder of the chain's own that get_config reads first (the user cache), and
# folds and configs.tgz use that copy. Extract configs.tgz into src/experts_int8/kernels/configs.
export EXPERTS_INT8_CACHE=$R/cache
D=$EXPERTS_INT8_CACHE/configs
rm -rf "$D" && mkdir -p "$D" && cp src/experts_int8/kernels/configs/*.json "$D"/
tables_tgz() { tar czf "$R/configs.tgz" -C "$D" .; }
exec >"$R/chain.log" 2>&1
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
