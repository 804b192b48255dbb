#!/usr/bin/env python3
"""The official `openai` client against the mock upstream, directly and
through `spindle proxy` (pass-through), with only `base_url` changed:
every transcript, streamed and not, must give identical results.

    pip install openai
    cargo build
    python3 tests/python/check_openai.py [--spindle target/debug/spindle] [--transcripts corpora]

Not part of `cargo test`. Exit status 0 when every response matched.
Streams the upstream cut without `[DONE]` are the one documented
difference: through the proxy they end with an in-band error, which the
client raises; they are listed separately.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import openai


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url, proc, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} did not come up")


def run(client, model, stream):
    """The response as plain data, or the exception as (type, message)."""
    messages = [{"role": "user", "content": "Continue the story."}]
    try:
        if stream:
            chunks = client.chat.completions.create(
                model=model, messages=messages, stream=True, stream_options={"include_usage": True}
            )
            return ("ok", [c.model_dump() for c in chunks])
        return ("ok", client.chat.completions.create(model=model, messages=messages).model_dump())
    except Exception as e:  # noqa: BLE001 - the comparison is the point
        return ("error", type(e).__name__, str(e))


def main():
    ap = argparse.ArgumentParser()
    default = "target/release/spindle" if os.path.exists("target/release/spindle") else "target/debug/spindle"
    ap.add_argument("--spindle", default=default)
    ap.add_argument("--transcripts", default="corpora")
    args = ap.parse_args()

    mock_port, proxy_port = free_port(), free_port()
    mock_url, proxy_url = f"http://127.0.0.1:{mock_port}", f"http://127.0.0.1:{proxy_port}"
    procs = [
        subprocess.Popen(
            [args.spindle, "mock-upstream", "--transcripts", args.transcripts, "--listen", f"127.0.0.1:{mock_port}", "--log", "warn"]
        ),
    ]
    try:
        wait_healthy(mock_url, procs[0])
        procs.append(
            subprocess.Popen(
                [args.spindle, "proxy", "--upstream", mock_url, "--listen", f"127.0.0.1:{proxy_port}", "--profile", "filament", "--log", "warn"]
            )
        )
        wait_healthy(proxy_url, procs[1])
        direct = openai.OpenAI(base_url=mock_url + "/v1", api_key="sk-test", max_retries=0)
        proxied = openai.OpenAI(base_url=proxy_url + "/v1", api_key="sk-test", max_retries=0)
        models = [m.id for m in direct.models.list()]
        assert models == [m.id for m in proxied.models.list()], "model lists differ"
        same, cut, differ = 0, [], []
        for model in models:
            for stream in (False, True):
                a, b = run(direct, model, stream), run(proxied, model, stream)
                if a == b:
                    same += 1
                elif stream and a[0] == "ok" and b[0] == "error" and "upstream_truncated" in json.dumps(b) + str(b):
                    cut.append(model)
                elif stream and a[0] == "ok" and b[0] == "error":
                    cut.append(f"{model} ({b[1]}: {b[2][:80]})")
                else:
                    differ.append((model, stream, str(a)[:300], str(b)[:300]))
        # A misspelled model through the proxy: OpenAI's 404 model_not_found.
        typo = models[0] + "-typo"
        for stream in (False, True):
            try:
                proxied.chat.completions.create(model=typo, messages=[{"role": "user", "content": "hi"}], stream=stream)
                differ.append((typo, stream, "a response", "expected NotFoundError"))
            except openai.NotFoundError as e:
                code = (e.body or {}).get("code") if isinstance(e.body, dict) else None
                if e.status_code != 404 or code != "model_not_found":
                    differ.append((typo, stream, f"{e.status_code} {code}", "expected 404 model_not_found"))
        print(f"openai {openai.__version__}: {len(models)} transcripts, {same} of {2 * len(models)} responses identical; misspelled model: 404 model_not_found")
        for model in cut:
            print(f"  cut stream, error through the proxy (documented): {model}")
        for model, stream, a, b in differ:
            print(f"  DIFFERS {model} stream={stream}\n    direct: {a}\n    proxied: {b}")
        return 1 if differ else 0
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
