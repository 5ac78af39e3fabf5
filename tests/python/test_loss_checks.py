"""The loss checks of the convergence report and of the PyTorch example's
launcher: a NaN loss (a step that diverged) is over any bound, not a step
that compares false against it and passes.

    build/venv/bin/python -m unittest discover -s tests/python"""
import importlib.util
import os
import sys
import unittest

TOP = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
NAN = float("nan")


def load(name, path):
    sys.path.insert(0, os.path.dirname(path))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.pop(0)


report = load("convergence_report", os.path.join(TOP, "scripts", "convergence_report.py"))
launch = load("launch", os.path.join(TOP, "examples", "torch", "launch.py"))


class ConvergenceReport(unittest.TestCase):
    def test_a_nan_loss_is_over_the_bound(self):
        static = {1: (5.0, "a"), 2: (4.0, "a"), 3: (3.0, "a")}
        switched = {1: (5.0, "a"), 2: (NAN, "b"), 3: (3.0, "b")}
        rel, worst, over, equal = report.deviation(static, switched, 3, 1e-3)
        self.assertEqual((worst, over, equal), (2, 2, 2))
        self.assertEqual(rel[1], float("inf"))

    def test_close_losses_are_within(self):
        static = {1: (5.0, "a"), 2: (4.0, "a")}
        rel, worst, over, equal = report.deviation(static, {1: (5.0, "a"), 2: (4.0001, "b")}, 2, 1e-3)
        self.assertEqual((over, equal), (0, 1))


class Launch(unittest.TestCase):
    def test_a_nan_loss_is_over_the_bound(self):
        dev, worst, held = launch.within({1: 5.0, 2: NAN, 3: 3.0}, {1: 5.0, 2: 4.0, 3: 3.0}, 3)
        self.assertEqual((dev, worst, held), (float("inf"), 2, False))

    def test_close_losses_are_within(self):
        dev, worst, held = launch.within({1: 5.0, 2: 4.0001}, {1: 5.0, 2: 4.0}, 2)
        self.assertTrue(held)
        self.assertEqual(worst, 2)


if __name__ == "__main__":
    unittest.main()
