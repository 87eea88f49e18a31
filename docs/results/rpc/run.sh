cd /work/main
.venv/bin/specsample rpc-worker --port 50071 --threads 2 > /tmp/rpcb/w1.log 2>&1 & W1=$!
.venv/bin/specsample rpc-worker --port 50072 --threads 2 > /tmp/rpcb/w2.log 2>&1 & W2=$!
sleep 3
for d in 2 0; do
  /usr/bin/time -v .venv/bin/specsample bench --backend llamacpp --threads 2 --target-quant bf16 --tasks humaneval --prompts 4 --settings greedy --modes ar,spec-auto --no-parity --target-rpc 127.0.0.1:50071,127.0.0.1:50072 --tensor-split 1,1 --rpc-delay-ms $d --out /tmp/rpcb/delay-$d > /tmp/rpcb/delay-$d.log 2>&1
  echo "done $d $(date)" >> /tmp/rpcb/progress
done
kill $W1 $W2
.venv/bin/specsample bench --backend llamacpp --threads 2 --target-quant bf16 --tasks humaneval --prompts 4 --settings greedy --modes ar,spec-auto --no-parity --out /tmp/rpcb/local > /tmp/rpcb/local.log 2>&1
echo "done local $(date)" >> /tmp/rpcb/progress
