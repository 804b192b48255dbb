import json, subprocess, sys
p = json.load(sys.stdin)
# A child that would keep running; the runner must kill the whole group.
subprocess.Popen(["sh", "-c", "sleep 120; : " + p.get("marker", "hang")]).wait()
