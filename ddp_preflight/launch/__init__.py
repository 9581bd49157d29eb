"""Launch: start the training on every node with what preflight found, bring every rank's
output back, and stop everything together (plan -> run -> outcome; output for the lines; ends for
who failed first, by hangwatch's one rule; watched for a launch with hangwatch, as one call)."""

from .outcome import LaunchedRank, LaunchResult, NodeState, render
from .output import Line
from .plan import Command, NodePlan, Plan, PlanError, build_plan, parse_command
from .run import Launch
from .watched import WatchedLaunch, watched

__all__ = ["Command", "Launch", "LaunchResult", "Line", "NodePlan", "NodeState", "Plan",
           "PlanError", "LaunchedRank", "WatchedLaunch", "build_plan", "parse_command", "render", "watched"]
