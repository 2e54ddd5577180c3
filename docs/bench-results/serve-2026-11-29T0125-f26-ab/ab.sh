cd /work/main
for r in 1 2; do for v in base copy; do
  SPARQ_BIN=/tmp/sparq-$v scripts/bench_serve.sh --no-shared --init scaled --results /tmp/ab-$v-$r > /tmp/ab-$v-$r.log 2>&1
done; done
echo done > /tmp/ab.done
