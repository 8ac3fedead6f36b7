import pytest

from accelsweep.trainables.timing.windows import WindowStats, percentile, time_window


def test_percentile_interpolates():
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 90) == 5.0
    assert percentile([], 50) != percentile([], 50)  # NaN


class FakeClock:
    def __init__(self, step_s):
        self.now, self.step_s = 0.0, step_s

    def __call__(self):
        return self.now

    def advance(self):
        self.now += self.step_s


def test_window_runs_until_both_minimums_and_syncs_only_at_its_edges():
    clock, syncs = FakeClock(0.125), []
    window = time_window(clock.advance, lambda: syncs.append(clock.now), min_steps=3, min_seconds=1.0,
                         clock=clock)
    assert window.steps == 8  # 1.0 s at 0.125 s/step, more than the 3-step minimum
    assert len(syncs) == 2  # one sync at each edge, none per step
    assert window.seconds == pytest.approx(1.0)
    slow = FakeClock(1.0)
    assert time_window(slow.advance, lambda: None, min_steps=5, min_seconds=0.5, clock=slow).steps == 5


def test_async_devices_get_window_means_not_enqueue_times():
    stats = WindowStats(samples_per_step=4, host_clock_times_steps=False)
    clock = FakeClock(0.5)
    stats.add(time_window(clock.advance, lambda: None, 2, 0.0, clock=clock))
    assert stats.step_times == [pytest.approx(0.5)]
    assert stats.throughput == pytest.approx(8.0)
    assert "window mean" in stats.step_time_source


def test_window_ends_on_a_whole_number_of_groups():
    clock = FakeClock(0.125)
    window = time_window(clock.advance, lambda: None, min_steps=5, min_seconds=0.0, clock=clock, step_multiple=4)
    assert window.steps == 8
