cd /work/main
for r in 1 2 3; do
  LLAMA_SERVER=/tmp/llama.cpp/build/bin/llama-server scripts/bench_serve.sh --no-shared --init scaled --results /tmp/s10/serve-main/run-$r > /tmp/s10/serve-main/run-$r.log 2>&1
done
echo done > /tmp/s10/serve-main/done
