import json, sys, time
p = json.load(sys.stdin)
time.sleep(float(p.get("seconds", 0.2)))
print(json.dumps({"rendered": p.get("prompt", "")}))
