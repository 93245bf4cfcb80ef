"""Test kit: a scripted provider on loopback, its steps, and the scenario runner.

Public, for streamengine's own tests, its demo and CLI harness, and your tests.

- ``provider``: :class:`FakeProvider`, a real threaded HTTP/1.1 server on
  127.0.0.1 that answers from scripted turns, on the Chat Completions,
  Anthropic (``wire="anthropic"``) or Responses (``wire="responses"``) wire;
- ``steps``: what a turn does (``s.text``, ``s.delay``, ``s.drop``...);
- scenarios: JSON scenario files run against the engine (:func:`load_scenario`,
  :func:`run_scenario`; ``streamengine harness`` runs them and
  ``streamengine harness --format`` prints the format);
- :func:`write_junit`: their results as JUnit XML for CI servers;
- :class:`RunClient`: a client of served runs that resumes with Last-Event-ID
  after the server's ``retry:`` until the terminal frame (docs/runs.md).

::

    from streamengine.testing import FakeProvider, steps as s
"""
from . import _steps as steps
from ._junit import write_junit as write_junit
from ._provider import FakeProvider as FakeProvider
from ._provider import RecordedRequest as RecordedRequest
from ._provider import Turn as Turn
from ._provider import fake_embedding as fake_embedding
from ._run_client import RunClient as RunClient
from ._run_client import RunClientError as RunClientError
from ._run_client import RunEvent as RunEvent
from ._scenario import Scenario as Scenario
from ._scenario import ScenarioError as ScenarioError
from ._scenario import ScenarioResult as ScenarioResult
from ._scenario import load_scenario as load_scenario
from ._scenario import parse_scenario as parse_scenario
from ._scenario import run_scenario as run_scenario
from ._steps import Stamp as Stamp
from ._steps import Step as Step
from ._steps import StepLike as StepLike

__all__ = ["FakeProvider", "RecordedRequest", "RunClient", "RunClientError", "RunEvent", "Scenario", "ScenarioError",
           "ScenarioResult", "Stamp", "Step", "StepLike", "Turn", "fake_embedding", "load_scenario", "parse_scenario",
           "run_scenario", "steps", "write_junit"]
