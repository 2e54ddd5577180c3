"""Shared set-up for the Python package's tests (run by scripts/run_tests.sh
from `make test`, or by hand: SPARQ_BUILD=build python3 -m pytest tests/python).

The package under test is python/sparq of this tree; the library is
$SPARQ_LIB or $SPARQ_BUILD/libsparq.so; the model is found through the same
search path as the C tests ($SPARQ_MODEL_PATH, ../shared/models, ../shared).
"""
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.path.join(ROOT, os.environ.get("SPARQ_BUILD", "build"))
sys.path.insert(0, os.path.join(ROOT, "python"))
os.environ.setdefault("SPARQ_LIB", os.path.join(BUILD, "libsparq.so"))
# ../shared relative to the repository, wherever pytest was started from
_extra = [os.path.join(ROOT, "..", "shared", "models"), os.path.join(ROOT, "..", "shared")]
os.environ["SPARQ_MODEL_PATH"] = ":".join(
    [p for p in os.environ.get("SPARQ_MODEL_PATH", "").split(":") if p] + _extra)

# OpenMP workers spin between parallel regions by default; between two evals
# Python runs for a while, and on a loaded machine the spinning worker takes
# the core the Python thread needs (48 tokens: 35 s instead of 0.05 s).
# libgomp reads this when the library is loaded, after this line.
os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import sparq  # noqa: E402

PROMPT = "Once upon a time"


@pytest.fixture(scope="session")
def model_path():
    p = sparq.find_model("stories260K.gguf")
    if p is None:
        pytest.skip("stories260K.gguf not found (reference data missing)")
    return os.path.abspath(p)  # tests run subprocesses in other directories


@pytest.fixture(scope="session")
def sparq_bin():
    p = os.path.join(BUILD, "sparq")
    assert os.access(p, os.X_OK), "%s not built" % p
    return p


@pytest.fixture
def model(model_path):
    m = sparq.Model(model_path)
    yield m
    m.close()


def sparq_run(sparq_bin, model_path, *args):
    """stdout of `sparq run` (bytes), without the newline it ends with."""
    r = subprocess.run([sparq_bin, "run", "-m", model_path, *args], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, check=False)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert r.stdout.endswith(b"\n")
    return r.stdout[:-1]
