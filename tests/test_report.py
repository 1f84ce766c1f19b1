

def test_the_summary_says_when_affinity_overloads_a_pool() -> None:
    """Spill-over happens only when every worker of the preferred pool is full, so a noticeable share
    of requests run elsewhere means the map gives that pool more than it holds (shipped h800-vs-h20:
    41 % of requests spilled from 2 H800 at 94 % busy, 0.57 trajectories/s against 1.11 routed
    least-loaded); the paper plans spill none, and a few spills say nothing."""
    from rollart.report import routing_text

    base = {"routed_preferred": 960, "gpu_busy_fraction": {"h800": 0.94, "h20": 0.71}}
    text = routing_text({**base, "routed_fallback": 40 + 600, "routed_fallback_from": {"h800": 600, "h20": 40}})
    assert text is not None and text.startswith("640 requests (40%) ran off h800 (94% busy)")
    assert "placement.hw_affinity={}" in text
    assert routing_text({**base, "routed_fallback": 40, "routed_fallback_from": {"h800": 40}}) is None  # 4 %
    assert routing_text({"routed_fallback": 0, "routed_preferred": 0}) is None
    assert routing_text({}) is None  # a summary from before the counters
