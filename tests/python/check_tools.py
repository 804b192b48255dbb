#!/usr/bin/env python3
"""Tool calling through `spindle proxy --tool-protocol P` with the official
`openai` client, only `base_url` changed, against the mock upstream serving
`corpora/tools/P-weather.txt` (a model that writes its calls as text).

    spindle mock-upstream --transcripts corpora --listen 127.0.0.1:8788 &
    spindle proxy --upstream http://127.0.0.1:8788 --tool-protocol hermes --listen 127.0.0.1:8787 &
    python3 tests/python/check_tools.py --base-url http://127.0.0.1:8787/v1 --protocol hermes

Checks, streamed and not: `tool_calls` with the intended name and
arguments, `finish_reason == "tool_calls"`, no call text in the content;
then sends the client's second request (the assistant message with its
tool calls and one `role: "tool"` result per call). Run by
`cargo test --test proxy_tools` when `.ci/cache/venv` has the client.
"""

import argparse
import json
import sys

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Current weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "state": {"type": "string"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]

CITY = {"hermes": "Dallas", "filament": "Oslo", "tam": "Oslo", "action": "Oslo"}
MARKERS = ["<tool_call", "</tool_call>", "REQUEST_TOOL", "END_TOOL", "<ACTION", "</ACTION>"]


def check(name, ok, detail=""):
    if not ok:
        print(f"FAIL {name}: {detail}")
        sys.exit(1)
    print(f"ok   {name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--protocol", required=True, choices=sorted(CITY))
    args = ap.parse_args()
    client = openai.OpenAI(base_url=args.base_url, api_key="not-needed")
    model = f"tools/{args.protocol}-weather"
    messages = [{"role": "user", "content": "What is the weather?"}]

    whole = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
    choice = whole.choices[0]
    calls = choice.message.tool_calls or []
    check("whole: finish_reason", choice.finish_reason == "tool_calls", choice.finish_reason)
    check("whole: tool call name", calls and calls[0].function.name == "get_current_weather", calls)
    check("whole: arguments", json.loads(calls[0].function.arguments)["city"] == CITY[args.protocol], calls)
    content = choice.message.content or ""
    check("whole: no call text", not any(m in content for m in MARKERS), content)

    stream = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True)
    names, arguments, ids, text, finish = {}, {}, {}, "", None
    for chunk in stream:
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
            for d in c.delta.tool_calls or []:
                if d.id:
                    ids[d.index] = d.id
                if d.function and d.function.name:
                    names[d.index] = d.function.name
                if d.function and d.function.arguments:
                    arguments[d.index] = arguments.get(d.index, "") + d.function.arguments
    check("stream: finish_reason", finish == "tool_calls", finish)
    check("stream: tool call name", names.get(0) == "get_current_weather", names)
    check("stream: arguments", json.loads(arguments[0])["city"] == CITY[args.protocol], arguments)
    check("stream: ids", len(set(ids.values())) == len(names), ids)
    check("stream: no call text", not any(m in text for m in MARKERS), text)

    # The second request: the calls and their results go back.
    history = messages + [choice.message.model_dump(exclude_none=True)]
    for call in calls:
        history.append({"role": "tool", "tool_call_id": call.id, "content": "Sunny, 22 C"})
    again = client.chat.completions.create(model=model, messages=history, tools=TOOLS)
    check("second request answered", again.choices[0].finish_reason == "tool_calls", again.choices[0])
    print("all ok")


if __name__ == "__main__":
    main()
