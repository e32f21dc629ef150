import json, time, urllib.request
body = json.dumps({"prompt": list(range(1, 33)), "max_tokens": 700, "stream": True, "ignore_eos": True, "temperature": 0}).encode()
req = urllib.request.Request("http://127.0.0.1:18555/v1/completions", data=body, headers={"Content-Type": "application/json"})
ts = []
with urllib.request.urlopen(req) as r:
    for line in r:
        if line.startswith(b"data: {"):
            ts.append(time.perf_counter())
g = [(b - a) * 1e3 for a, b in zip(ts[:-1], ts[1:])]
med = sorted(g)[len(g)//2]
print("median %.2f" % med, "slow:", [(i, round(x,1)) for i, x in enumerate(g) if x > 1.6*med])
