"""The backend set's health rules, with an injected clock: ejection, re-admission on
probation, and a hung backend's ejection."""

from __future__ import annotations

from prefix_router.backends import BackendSet

A, B = "http://a", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def ejected_and_readmitted() -> tuple[BackendSet, Clock]:
    clock = Clock()
    s = BackendSet(eject_after=3, readmit_after=5.0, clock=clock)
    s.set_members([A, B])
    for _ in range(3):
        s.report_failure(A, "timeout")
    assert [b.url for b in s.healthy()] == [B]
    clock.now = 5.0
    s.probe_result(A, ok=True)  # its probes pass: back, on probation
    return s, clock


def test_a_readmitted_backend_takes_one_request_at_a_time_until_it_answers() -> None:
    s, _ = ejected_and_readmitted()
    assert {b.url for b in s.healthy()} == {A, B}
    with s.trying(A):
        assert [b.url for b in s.healthy()] == [B] and not s.takes(A)
    assert {b.url for b in s.healthy()} == {A, B}  # that try ended without a word: another
    with s.trying(A):
        s.report_success(A)
        assert {b.url for b in s.healthy()} == {A, B}
    with s.trying(A):  # off probation: no more trials
        assert {b.url for b in s.healthy()} == {A, B} and s.takes(A)


def test_a_streams_first_token_ends_the_probation() -> None:
    s, _ = ejected_and_readmitted()
    with s.trying(A):
        s.answered(A)
        assert {b.url for b in s.healthy()} == {A, B}  # the rest of the stream is no trial
    assert s.report_failure(A, "stream cut") is False  # and one failure no longer ejects


def test_one_failure_on_probation_ejects_again() -> None:
    s, _ = ejected_and_readmitted()
    with s.trying(A):
        assert s.report_failure(A, "no first token") is True
    assert [b.url for b in s.healthy()] == [B]


def test_a_backend_on_trial_still_takes_requests_when_it_is_all_there_is() -> None:
    s, _ = ejected_and_readmitted()
    s.set_members([A])
    with s.trying(A):
        assert [b.url for b in s.healthy()] == [A] and s.takes(A)


def test_a_hung_backend_is_ejected_at_once_and_its_listeners_told() -> None:
    s = BackendSet(eject_after=3, readmit_after=5.0, clock=Clock())
    s.set_members([A, B])
    gone: list[str] = []
    hung: list[tuple[str, str]] = []
    s.on_gone(gone.append)
    s.on_hung(lambda url, why: hung.append((url, why)))
    s.report_hung(A, "no progress")
    assert [b.url for b in s.healthy()] == [B]
    assert gone == [A] and hung == [(A, "no progress")]
    s.report_hung(A, "still none")  # out already: what still waits there is cut all the same
    assert gone == [A] and len(hung) == 2
