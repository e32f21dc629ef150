#!/bin/sh
$1 serve -m /tmp/smollm2-135m-q8_0.gguf --port 18555 -t 2 --parallel 4 -c 1024 > /tmp/srv-$2.log 2>&1 &
sleep 3
PID=$(pgrep -f "serve -m /tmp/smollm2-135m-q8_0.gguf --port 18555")
for i in 1 2 3 4 5; do
  python3 /tmp/one.py | python3 -c "
import sys, ast
line = sys.stdin.read()
slow = ast.literal_eval(line.split('slow: ')[1])
pb = [i for i, x in slow if (i + 33) % 128 in (0, 1, 127)]
print('$2 req $i', line.split(' slow')[0], 'slow', len(slow), 'at page boundaries', len(pb), [round(x) for i, x in slow if (i + 33) % 128 in (0, 1, 127)])
"
done
kill $PID; sleep 1
