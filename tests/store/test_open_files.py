import errno
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


def _free_descriptors() -> int:
    """How many more files this process can open now (under its soft limit)."""
    opened = []
    try:
        while True:
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as exc:
        assert exc.errno == errno.EMFILE
    finally:
        for fd in opened:
            os.close(fd)
    return len(opened)


def _maps_past_the_open_file_limit(map_file, directory) -> bool:
    """Whether `map_file` maps more queue files than the open-file limit would let stay open."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    probe = os.open(os.devnull, os.O_RDONLY)  # the lowest free descriptor: the limit is set just above it
    os.close(probe)
    resource.setrlimit(resource.RLIMIT_NOFILE, (probe + 8, hard))
    mappings = []
    try:
        count = _free_descriptors() + 4
        for i in range(count):
            mappings.append(map_file(str(directory / f"q{i}" / "00000000000000000000"), 4096, True))
        return True
    except OSError as exc:
        assert exc.errno == errno.EMFILE
        return False
    finally:
        for mm in mappings:
            mm.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_the_builders_mappings_hold_descriptors_as_the_flag_says(tmp_path):
    """`MAPPINGS_HOLD_DESCRIPTORS` (what a worker's budget is taken from) says whether mappings
    made by `batch_builder.map_file` count against the open-file limit: more of them than the
    limit leaves room for are made only where they hold no descriptor.  Python's mmap module
    holds one."""
    assert _maps_past_the_open_file_limit(batch_builder.map_file, tmp_path / "builder") == (
        not batch_builder.MAPPINGS_HOLD_DESCRIPTORS
    )
    assert not _maps_past_the_open_file_limit(batch_builder.map_file_python, tmp_path / "python")
