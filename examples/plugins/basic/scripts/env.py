import json, os
print(json.dumps(dict(sorted(os.environ.items()))))
