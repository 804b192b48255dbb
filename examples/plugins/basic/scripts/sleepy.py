import json, sys, time
p = json.load(sys.stdin)
time.sleep(float(p.get("seconds", 0.1)))
print(json.dumps({"slept": p.get("seconds", 0.1), "label": p.get("label", "")}))
