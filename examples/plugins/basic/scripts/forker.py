import json, subprocess, sys
p = json.load(sys.stdin)
# Forks a grandchild that keeps running after this process exits; with
# "detach", in a session of its own (setsid), out of the tool's process
# group, as a daemon would.
subprocess.Popen(["sh", "-c", "sleep 120; : " + p.get("marker", "forker")],
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                 start_new_session=bool(p.get("detach")))
print("forked")
