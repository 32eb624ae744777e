"""Test servable whose load takes a while (its import sleeps): readiness must say 'loading'."""

import time

from forestflow.core.frame import Frame

time.sleep(2.0)


def predict(frame: Frame) -> Frame:
    return frame
