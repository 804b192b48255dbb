import json, sys
params = json.load(sys.stdin)
print(json.dumps({"echo": params}, ensure_ascii=False))
