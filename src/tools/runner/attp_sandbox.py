# The ATTP sandbox (spec 001): runs one [tool_call] code block for
# spindle's runner (src/tools/runner/attp.rs). Started as `python3 -I -S -c`
# with a scrubbed environment, in a process group spindle kills at the end.
#
# Protocol, one JSON object per line. spindle writes the job first:
#   {"code": "...", "functions": {"name": ["Tool.Id", ["param", ...]]},
#    "memory": BYTES, "cpu": SECONDS}
# The code's tool calls go out on stdout, each answered on stdin:
#   > {"call": "Tool.Id", "params": {...}}   < {"ok": true, "result": ...}
#                                            < {"ok": false, "error": "..."}
# and the end:
#   > {"done": true, "result": <__result__>, "printed": "..."}
#   > {"done": false, "error": "NameError: ...", "line": 3, "printed": "..."}
#
# The code sees the tool functions, the six libraries the spec lists
# (math, json, datetime, re, random, statistics), and a short list of
# builtins: no open, no eval/exec, no getattr; each library as its public
# names only (no `_` names, no modules). `import math` and
# `from datetime import timedelta` answer with those same libraries;
# nothing else can be imported. Classes can be defined. spindle's policy
# check (calls::attp::check_code) has already refused code that reaches
# for more; this namespace and the process limits are the second wall.
import ast
import builtins
import datetime as _datetime
import io
import json
import math
import random
import re
import statistics
import sys
import traceback
import types

SAFE = [
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr", "dict",
    "divmod", "enumerate", "filter", "float", "format", "frozenset", "hash", "hex", "int",
    "isinstance", "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "oct",
    "ord", "pow", "print", "range", "repr", "reversed", "round", "set", "slice", "sorted", "str",
    "sum", "tuple", "zip", "True", "False", "None",
    "Exception", "ArithmeticError", "AssertionError", "AttributeError", "IndexError", "KeyError",
    "LookupError", "NameError", "RuntimeError", "StopIteration", "TypeError", "ValueError",
    "ZeroDivisionError", "NotImplementedError", "OverflowError",
    "classmethod", "staticmethod", "property", "super",
]


class ToolError(Exception):
    """A tool the code called failed; the message is its observation."""


def main():
    proto_in = sys.stdin
    proto_out = sys.stdout
    job = json.loads(proto_in.readline())
    try:
        import resource

        memory = int(job.get("memory") or 0)
        if memory > 0:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        cpu = int(job.get("cpu") or 0)
        if cpu > 0:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    except (ImportError, ValueError, OSError):
        pass

    def plain(value, depth=0):
        # The value as JSON can hold it: NaN and infinities as text, sets
        # and tuples as lists, other objects as their str().
        if depth > 64:
            return repr(value)
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return str(value)
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, dict):
            return {str(k): plain(v, depth + 1) for k, v in value.items()}
        if isinstance(value, (list, tuple, set, frozenset)):
            return [plain(v, depth + 1) for v in value]
        return str(value)

    def send(obj):
        text = json.dumps(plain(obj), ensure_ascii=False, allow_nan=False)
        proto_out.write(text + "\n")
        proto_out.flush()

    def tool_function(name, tool, params):
        def call(*args, **kwargs):
            if len(args) > len(params):
                raise TypeError(
                    "%s() takes %d positional arguments but %d were given" % (name, len(params), len(args))
                )
            given = dict(zip(params, args))
            for key, value in kwargs.items():
                if key in given:
                    raise TypeError("%s() got multiple values for argument '%s'" % (name, key))
                given[key] = value
            send({"call": tool, "params": given})
            line = proto_in.readline()
            if not line:
                raise ToolError("spindle ended the run")
            reply = json.loads(line)
            if reply.get("ok"):
                return reply.get("result")
            raise ToolError(reply.get("error") or "the tool failed")

        call.__name__ = name
        return call

    def public(module):
        # A library's public names, no module among them (`random` holds
        # `os` as `_os`, others hold `sys`): what the code may reach.
        return types.SimpleNamespace(**{
            k: v for k, v in vars(module).items() if not k.startswith("_") and not isinstance(v, types.ModuleType)
        })

    # `datetime` as the spec uses it: the module, with the class's
    # constructors on it too (`datetime.now()`, `datetime.timedelta`).
    dt = public(_datetime)
    for attr in ("now", "today", "utcnow", "fromisoformat", "fromtimestamp", "strptime", "combine"):
        setattr(dt, attr, getattr(_datetime.datetime, attr))
    dt.parse = _datetime.datetime.fromisoformat

    printed = io.StringIO()

    def sandbox_print(*args, sep=" ", end="\n", **_):
        # Kept up to 64 KiB (the result shows the last 4 KiB of it).
        if printed.tell() < 65536:
            printed.write((sep.join(str(a) for a in args) + end)[:65536])

    libraries = {
        "math": public(math),
        "json": public(json),
        "datetime": dt,
        "re": public(re),
        "random": public(random),
        "statistics": public(statistics),
    }

    def sandbox_import(name, globals=None, locals=None, fromlist=(), level=0):
        # What `import` statements call: the libraries already injected,
        # nothing else (spec 001's prompt: "import nothing but these").
        if level != 0 or name not in libraries:
            raise ImportError("only these libraries can be imported: " + ", ".join(libraries))
        for item in fromlist or ():
            if item.startswith("_"):
                raise ImportError("names that start with _ cannot be imported")
        return libraries[name]

    safe = {name: getattr(builtins, name) for name in SAFE if hasattr(builtins, name)}
    safe["print"] = sandbox_print
    safe["__import__"] = sandbox_import
    safe["__build_class__"] = builtins.__build_class__
    scope = dict(libraries)
    scope.update({"__builtins__": safe, "__name__": "__attp__", "ToolError": ToolError})
    for name, (tool, params) in job.get("functions", {}).items():
        scope[name] = tool_function(name, tool, params)
    sys.stdout = printed
    last = "__attp_last__"
    try:
        # Code that never assigns __result__ ends, as in a notebook, with
        # the value of its last expression: kept under a name of its own.
        tree = ast.parse(job["code"], "<attp>")
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            expr = tree.body[-1]
            tree.body[-1] = ast.copy_location(
                ast.Assign(targets=[ast.Name(id=last, ctx=ast.Store())], value=expr.value), expr)
            ast.fix_missing_locations(tree)
        exec(compile(tree, "<attp>", "exec"), scope)
    except BaseException as e:  # everything, as the spec asks: the error goes back
        line = None
        for frame in traceback.extract_tb(e.__traceback__):
            if frame.filename == "<attp>":
                line = frame.lineno
        if isinstance(e, SyntaxError):
            line = e.lineno
        message = "%s: %s" % (type(e).__name__, e) if str(e) else type(e).__name__
        if isinstance(e, MemoryError):
            message = "MemoryError: the code used more memory than it may"
        send({"done": False, "error": message, "line": line, "printed": printed.getvalue()[-4096:]})
        return
    if "__result__" in scope:
        send({"done": True, "result": scope["__result__"], "printed": printed.getvalue()[-4096:]})
    elif scope.get(last) is not None:
        send({"done": True, "result": scope[last], "printed": printed.getvalue()[-4096:]})
    elif printed.getvalue():
        # What it printed is what it has to say.
        send({"done": True, "result": printed.getvalue()[-4096:], "printed": ""})
    else:
        send({"done": False, "error": "the code never assigned __result__, and printed nothing", "line": None,
              "printed": ""})


main()
