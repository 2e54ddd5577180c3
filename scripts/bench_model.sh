# bench_model.sh - sourced by the bench scripts (bench.sh, bench_prefill.sh,
# bench_answer.sh, bench_serve.sh, bench_levels.sh) after they set SPARQ:
# the generated model files they share, one name per shape, type and
# weights, so every script reuses what another wrote.

# bench_model DIR SHAPE TYPE INIT -> prints DIR/<shape>-<type>.gguf (plain
# weights) or DIR/<shape>-<type>-<init>.gguf, written by `sparq gen-model`
# when missing; returns 1 if it cannot be written.
bench_model() {
  local f
  f=$(bench_model_path "$@")
  [ -s "$f" ] || "$SPARQ" gen-model --shape "$2" --type "$3" --init "$4" -o "$f" >&2 || return 1
  echo "$f"
}

# bench_model_path DIR SHAPE TYPE INIT -> that name, without writing anything
bench_model_path() {
  local f
  f="$1/$2-$(echo "$3" | tr 'A-Z' 'a-z')"
  [ "$4" = plain ] && echo "$f.gguf" || echo "$f-$4.gguf"
}

# bench_init_ok INIT: whether --init names weights gen-model draws
bench_init_ok() { [ "$1" = plain ] || [ "$1" = scaled ]; }

# bench_cpu_id: lscpu's CPU family/model/stepping, e.g. 26/2/1
bench_cpu_id() {
  lscpu | sed -n 's/^CPU family: *//p;s/^Model: *//p;s/^Stepping: *//p' | paste -sd/ -
}
