"""Reading a /metrics page (the harness's and the tests'), with prometheus_client's own parser."""

from prometheus_client.parser import text_string_to_metric_families


def sample_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 with none)."""
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
