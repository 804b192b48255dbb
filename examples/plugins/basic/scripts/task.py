import json, subprocess, sys, time
p = json.load(sys.stdin)
seconds = float(p.get("seconds", 0.2))
if p.get("marker"):
    # The wait runs as a child that carries the marker on its command line,
    # so that the tests find it in the process table.
    subprocess.run(["sh", "-c", "sleep %s; : %s" % (seconds, p["marker"])])
else:
    time.sleep(seconds)
print(json.dumps({"rendered": p.get("prompt", "")}))
