import os
import resource

from tidemq.store.dispatch import builder as batch_builder
from tidemq.store.queues import open_files


def test_a_budget_of_mappings_holding_descriptors_is_a_share_of_the_open_file_limit():
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    expected = max(open_files.MIN_MAPPINGS, min(open_files.MAX_MAPPINGS, int((soft - open_files.RESERVE) * 0.5)))
    assert open_files.mapping_budget(0.5) == expected


def test_mappings_holding_no_descriptor_are_bounded_by_the_map_count_alone():
    """A low open-file limit does not shrink the budget of a cache whose mappings hold no
    descriptor (with 10,000 queues, 2 workers stopped mapping each other's files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
    try:
        assert open_files.mapping_budget(1.0) == 300 - open_files.RESERVE
        assert open_files.mapping_budget(1.0, descriptors=False) == open_files.MAX_MAPPINGS
        assert open_files.mapping_budget(0.5, descriptors=False) == open_files.MAX_MAPPINGS // 2
        assert open_files.mapping_budget(0.0, descriptors=False) == open_files.MIN_MAPPINGS
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_builders_mappings_hold_descriptors_as_the_flag_says(tmp_path):
    """`MAPPINGS_HOLD_DESCRIPTORS` (what a worker's budget is taken from) says whether a mapping
    made by `batch_builder.map_file` keeps a file open."""
    before = len(os.listdir("/proc/self/fd"))
    mappings = [batch_builder.map_file(str(tmp_path / f"q{i}" / "00000000000000000000"), 4096, True) for i in range(8)]
    held = len(os.listdir("/proc/self/fd")) - before
    for mm in mappings:
        mm.close()
    assert held == (8 if batch_builder.MAPPINGS_HOLD_DESCRIPTORS else 0)
