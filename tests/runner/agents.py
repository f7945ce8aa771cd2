"""Agent and grader scripts the runner tests of both backends run: plain programs with only the agent contract's
env, as users write them (sh + curl is the "any language" case)."""

SH_AGENT = """
set -eu
auth="Authorization: Bearer $OPENAI_API_KEY"
json="Content-Type: application/json"
curl -sf -H "$auth" -H "$json" "$OPENAI_BASE_URL/chat/completions" \\
  -d '{"model": "smollm2", "messages": [{"role": "user", "content": "hello from sh"}], "max_tokens": 8}'
curl -sf -H "$auth" -H "$json" "$AGL_EVENT_URL" -d '{"kind": "note", "data": {"lang": "sh"}}'
"""

GRADED_AGENT = """
import json, os
task = json.loads(os.environ["AGL_TASK_INPUT"])
with open(task["env_dump"], "w") as f:
    json.dump(dict(os.environ), f)
with open(os.path.join(os.environ["AGL_RESULT_DIR"], "answer.txt"), "w") as f:
    f.write(str(task["a"] + task["b"]))
"""

GRADER = """
import json, os, urllib.request

def call(method, body=None):
    request = urllib.request.Request(
        os.environ["AGL_GRADE_URL"],
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": "Bearer " + os.environ["AGL_GRADER_KEY"], "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        return json.load(response)

rollout = call("GET")  # its metadata holds the reference answer, which the agent cannot read
with open(os.path.join(os.environ["AGL_RESULT_DIR"], "answer.txt")) as f:
    answer = f.read()
call("POST", {"kind": "reward", "value": 1.0 if answer == str(rollout["metadata"]["expected"]) else 0.0})
"""
