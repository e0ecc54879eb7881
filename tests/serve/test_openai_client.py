#!/usr/bin/env python3
"""OpenAI's official Python client (Debian 13's python3-openai), unchanged, against
`tinylm serve`: the model list, a plain and a streamed completion, and the errors it maps
(a wrong key, a bad request).
usage: test_openai_client.py path/to/tinylm scratch-dir
Exits 77 (skipped) where python3-openai is not installed (Debian 12 has no package)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving import Server, check, fresh_run  # noqa: E402

try:
    import openai
except ImportError:
    print("SKIPPED: python3-openai is not installed (Debian 13 has it; scripts/setup.sh installs it there)")
    sys.exit(77)

tinylm, work = sys.argv[1], sys.argv[2]
run = fresh_run(tinylm, work)
key = "tinylm-test-key"
srv = Server(tinylm, run, "--api-key", key, work=work)
client = openai.OpenAI(base_url="http://%s:%d/v1" % (srv.host, srv.port), api_key=key, max_retries=0)
try:
    models = client.models.list()
    ids = [m.id for m in models.data]
    check(ids == ["step-00000360"], "models: %r" % ids)

    plain = client.completions.create(model=ids[0], prompt="3 4 5 6", max_tokens=8, temperature=0)
    text = plain.choices[0].text
    check(len(text.split()) == 8 and plain.choices[0].finish_reason == "length", "plain: %r" % plain)
    check(plain.usage.prompt_tokens == 4 and plain.usage.completion_tokens == 8, "usage: %r" % plain.usage)

    seeded = client.completions.create(model=ids[0], prompt="3 4 5 6", max_tokens=120, seed=9, temperature=1.2)
    pieces, finish = [], None
    for chunk in client.completions.create(model=ids[0], prompt="3 4 5 6", max_tokens=120, seed=9, temperature=1.2,
                                           stream=True):
        if chunk.choices:
            pieces.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
    # Tokens that come within a millisecond of each other share an event, but the first
    # goes out alone: at least two, however fast the model or busy the machine.
    check("".join(pieces) == seeded.choices[0].text and finish == "length" and len([p for p in pieces if p]) >= 2,
          "streamed %r, plain %r" % (pieces, seeded.choices[0].text))

    try:
        client.completions.create(model=ids[0], prompt="3 4", max_tokens=-5)
        check(False, "a negative max_tokens was accepted")
    except openai.BadRequestError as e:
        check("max_tokens" in str(e), "the bad request's message: %s" % e)
    wrong = openai.OpenAI(base_url=client.base_url, api_key="not-the-key", max_retries=0)
    try:
        wrong.models.list()
        check(False, "a wrong key was accepted")
    except openai.AuthenticationError:
        pass
finally:
    status = srv.stop()
check(status == 0, "serve's exit status %d" % status)
print("ok: openai %s: models, a plain and a streamed completion (%d pieces), BadRequestError, AuthenticationError"
      % (openai.__version__, len(pieces)))
