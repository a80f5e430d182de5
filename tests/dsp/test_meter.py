import math

import numpy as np

from dsp.meter import FLOOR_DB, LevelMeter, dbfs_peak, dbfs_rms
from tests.dsp.helpers import chunkings, split, tone


def test_sine_levels() -> None:
    x = tone(1000, 8000, 1.0, amp=0.1)
    assert abs(dbfs_peak(x) - (-20.0)) < 1e-3
    assert abs(dbfs_rms(x) - (-20.0 - 10 * math.log10(2))) < 1e-3  # -23.01 dBFS


def test_full_scale_int16_and_silence() -> None:
    assert dbfs_peak(np.array([-32768, 0], dtype=np.int16)) == 0.0
    assert dbfs_rms(np.zeros(10)) == FLOOR_DB
    assert dbfs_peak(np.zeros(0)) == FLOOR_DB
    assert dbfs_rms(np.zeros(10), floor_db=-90.0) == -90.0


def test_streaming_meter_equals_one_shot() -> None:
    x = np.random.default_rng(3).standard_normal(20000) * 0.05
    for _name, sizes in chunkings(x.size):
        m = LevelMeter()
        for c in split(x, sizes):
            m.process(c)
        assert m.samples == x.size
        assert abs(m.rms_dbfs - dbfs_rms(x)) < 1e-9
        assert m.peak_dbfs == dbfs_peak(x)
    m.reset()
    assert m.rms_dbfs == FLOOR_DB and m.peak_dbfs == FLOOR_DB
