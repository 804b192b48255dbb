import json, sys
p = json.load(sys.stdin)
print(p["a"] + p["b"])
