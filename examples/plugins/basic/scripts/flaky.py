import json, sys
p = json.load(sys.stdin)
path = p["counter_file"]
try:
    n = int(open(path).read() or "0")
except FileNotFoundError:
    n = 0
n += 1
open(path, "w").write(str(n))
if n < int(p.get("succeed_on", 3)):
    sys.stderr.write("attempt %d failed\n" % n)
    sys.exit(1)
print(json.dumps({"attempt": n}))
