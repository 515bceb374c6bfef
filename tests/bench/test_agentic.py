"""The agentic workload: agent sessions whose chats carry every shape the prompt module handles."""

from bench.harness.oracle import oracle_hit_rate
from bench.harness.workloads import build, messages_for
from engine_sim.hf_tokenizer import TINY_TOKENIZER, ChatTokenizer


def test_agent_sessions_have_tools_calls_parts_and_images_and_grow_turn_by_turn() -> None:
    wl = build("agentic", 120)
    kinds = {s.system for s in wl.sessions}
    assert 2 <= len(kinds) <= 6  # one system prompt per agent kind, shared by sessions
    for s in wl.sessions:
        assert s.tools
        for t in range(len(s.turns) - 1):
            answers = [f"answer {i}" for i in range(t + 1)]
            now, nxt = messages_for(s, t, answers[:t]), messages_for(s, t + 1, answers)
            assert nxt[: len(now)] == now  # the history grows
            assert nxt[len(now)] == {"role": "assistant", "content": answers[t]}
    msgs = [m for s in wl.sessions for m in messages_for(s, len(s.turns) - 1,
                                                        ["a"] * (len(s.turns) - 1))]
    assert any(isinstance(m["content"], list) and any(p["type"] == "image_url"
                                                      for p in m["content"]) for m in msgs)
    assert any(m.get("tool_calls") and isinstance(m["tool_calls"][0]["function"]["arguments"],
                                                  str) for m in msgs)  # fmt: skip
    assert any(m["role"] == "tool" and isinstance(m["content"], list) for m in msgs)


def test_the_oracle_counts_the_tools_the_requests_were_sent_with() -> None:
    wl = build("agentic", 12)
    tok = ChatTokenizer(TINY_TOKENIZER)
    s = wl.sessions[0]
    sent = [messages_for(s, 0, []), messages_for(s, 0, [])]
    with_tools = oracle_hit_rate(sent, 1_000_000, tokenizer=tok, tools=[s.tools, s.tools])
    without = oracle_hit_rate(sent, 1_000_000, tokenizer=tok)
    # the second request hits the first's blocks either way; with the tools both are longer
    assert with_tools > without > 0.4
