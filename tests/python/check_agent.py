"""The official openai client against `spindle proxy --tool-protocol hermes
--tools DIR --agent` (run by tests/proxy_agent.rs): a plain question, no
`tools`, gets the final answer of the proxy's tool conversation, streamed
and whole; the intermediate steps arrive in the `spindle` extra field."""

import argparse
import sys

from openai import OpenAI


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key="unused")
    messages = [{"role": "user", "content": "What is 2 + 40?"}]

    stream = client.chat.completions.create(model="m", messages=messages, stream=True)
    text, steps, finish = "", [], None
    for chunk in stream:
        extra = (chunk.model_extra or {}).get("spindle")
        if extra:
            steps.append(extra["type"])
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == "Let me add them.\n\nThe sum is 42.", repr(text)
    assert steps == ["tool_call", "tool_result", "agent_end"], steps
    assert finish == "stop", finish
    print("streamed:", repr(text), steps)

    whole = client.chat.completions.create(model="m", messages=messages)
    assert whole.choices[0].message.content == "Let me add them.\n\nThe sum is 42.", whole
    assert whole.choices[0].finish_reason == "stop"
    spindle = (whole.model_extra or {}).get("spindle") or {}
    assert spindle.get("reason") == "answer" and len(spindle.get("steps", [])) == 2, spindle
    print("whole:", repr(whole.choices[0].message.content), spindle["reason"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
