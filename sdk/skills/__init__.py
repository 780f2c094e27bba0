"""Skills: the Agent Skills format, workflow skills, and skill sets in the registry.

A skill is a folder with a ``SKILL.md`` (YAML front matter ``name`` and ``description``,
Markdown instructions) and optional files (:mod:`~evoharness.sdk.skills.format`); a
workflow skill also carries a compiled ``workflow.json``, a deterministic procedure over
the app's own tools that the agent calls as one tool (:mod:`~evoharness.sdk.skills.workflow`).
Skill sets are versioned registry artifacts of kind ``skills``
(:mod:`~evoharness.sdk.skills.registry`), served per session through the session door
(``create_evo_agent(skills="<name>")``). See ``docs/skills.md``.
"""

from evoharness.sdk.skills.format import (
    SKILL_FILE,
    Skill,
    SkillFormatError,
    export_skill,
    export_skills,
    import_skill,
    import_skills,
    skill_name,
)
from evoharness.sdk.skills.registry import (
    SKILLS,
    SkillSet,
    SkillVersions,
    matches,
    skill_set_of,
    workflow_of,
)
from evoharness.sdk.skills.workflow import (
    WORKFLOW_FILE,
    WORKFLOW_PREFIX,
    ArgSource,
    Param,
    Workflow,
    WorkflowStep,
    select,
    workflow_tool_name,
)

__all__ = [
    "SKILLS",
    "SKILL_FILE",
    "WORKFLOW_FILE",
    "WORKFLOW_PREFIX",
    "ArgSource",
    "Param",
    "Skill",
    "SkillFormatError",
    "SkillSet",
    "SkillVersions",
    "Workflow",
    "WorkflowStep",
    "export_skill",
    "export_skills",
    "import_skill",
    "import_skills",
    "matches",
    "select",
    "skill_name",
    "skill_set_of",
    "workflow_of",
    "workflow_tool_name",
]
