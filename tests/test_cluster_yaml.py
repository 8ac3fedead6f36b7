"""cluster.yaml, the Ray cluster launcher config for AWS Trainium / Inferentia.

Nothing here talks to AWS: the file is checked against the cluster schema shipped in the
installed Ray, run through the offline part of what `ray up` does with it
(prepare_config + validate_config), and held to the rules it is written to: Neuron worker
types that scale from zero with their NeuronCores left to Ray, a head without NeuronCores,
no credentials, and setup commands that never replace the DLAMI's torch.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shlex

import pytest
import yaml

from tests.conftest import REPO

CLUSTER_YAML = os.path.join(REPO, "cluster.yaml")
NEURON_WORKER_TYPES = {"trn1.2xlarge", "trn1.32xlarge", "inf2.xlarge"}
# The torch stack the Neuron DLAMI's venv ships; installing any of them would replace it.
TORCH_STACK = {"torch", "torchvision", "torchaudio", "torch-xla", "torch-neuronx", "neuronx-cc", "libneuronxla"}
# Packages whose own dependencies include torch: only ever installed with --no-deps.
DEPENDS_ON_TORCH = {"timm", "accelsweep"}


@pytest.fixture(scope="module")
def text() -> str:
    with open(CLUSTER_YAML) as f:
        return f.read()


@pytest.fixture(scope="module")
def config(text) -> dict:
    return yaml.safe_load(text)


def node_types(config):
    return config["available_node_types"]


def head(config):
    return node_types(config)[config["head_node_type"]]


def workers(config):
    return {name: t for name, t in node_types(config).items() if name != config["head_node_type"]}


def all_commands(config) -> list[str]:
    keys = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
            "head_start_ray_commands", "worker_start_ray_commands")
    commands = [c for key in keys for c in config.get(key) or []]
    for node_type in node_types(config).values():
        for key in ("initialization_commands", "worker_setup_commands"):
            commands += node_type.get(key) or []
    return commands


def test_validates_against_rays_cluster_schema(config):
    import jsonschema
    import ray.autoscaler

    with open(os.path.join(os.path.dirname(ray.autoscaler.__file__), "ray-schema.json")) as f:
        schema = json.load(f)
    jsonschema.validate(config, schema)


def test_passes_the_offline_part_of_ray_up(config):
    """`ray up` fills in the provider's defaults, merges the setup commands and validates
    (ray.autoscaler._private.commands._bootstrap_config); only the provider bootstrap
    after that needs AWS."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(copy.deepcopy(config))
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["available_node_types"][prepared["head_node_type"]]["max_workers"] == 0
    # The defaults' setup commands (a Ray nightly wheel, boto3 into the system pip) must not leak in.
    assert not any("ray-wheels" in c or "anaconda3" in c for c in all_commands(prepared))


def test_the_three_neuron_worker_types_scale_from_zero(config):
    by_instance = {t["node_config"]["InstanceType"]: t for t in workers(config).values()}
    assert NEURON_WORKER_TYPES <= set(by_instance)
    for instance_type in NEURON_WORKER_TYPES:
        assert by_instance[instance_type]["min_workers"] == 0, instance_type
        assert by_instance[instance_type]["max_workers"] >= 0, instance_type


def test_neuron_cores_are_left_to_ray_and_ray_knows_them(config):
    """Ray's AWS node provider fills neuron_cores from its instance map; the config must not
    declare them for those types, and the map must agree with accelsweep's price table."""
    from ray._private.accelerators.neuron import NeuronAcceleratorManager
    from accelsweep.trainables.cost import PRICE_TABLE

    for name, node_type in workers(config).items():
        instance_type = node_type["node_config"]["InstanceType"]
        if instance_type not in NEURON_WORKER_TYPES:
            continue
        assert "neuron_cores" not in node_type["resources"], name
        filled = NeuronAcceleratorManager.get_ec2_instance_num_accelerators(instance_type, {})
        assert filled and filled == PRICE_TABLE[instance_type].units()["neuron_cores"], instance_type


def test_head_has_no_neuron_resources(config):
    from ray._private.accelerators.neuron import AWS_NEURON_INSTANCE_MAP

    node = head(config)
    assert "neuron_cores" not in node["resources"]
    instance_type = node["node_config"]["InstanceType"]
    assert instance_type not in AWS_NEURON_INSTANCE_MAP
    assert not instance_type.startswith(("trn", "inf")), instance_type
    assert node.get("max_workers", 0) == 0 and node.get("min_workers", 0) == 0


def test_each_neuron_type_carries_the_marker_trials_ask_for(config):
    """neuron_cores alone cannot tell trn1 from inf2: a trial pinned to --instance-type asks
    for the type's marker resource, so the autoscaler can start only that type."""
    from accelsweep.trainables.config import TrialConfig
    from accelsweep.trainables.platforms import get_platform

    for name, node_type in workers(config).items():
        instance_type = node_type["node_config"]["InstanceType"]
        if instance_type not in NEURON_WORKER_TYPES:
            continue
        trial = TrialConfig.make(platform="neuron", model="vit-b16", instance_type=instance_type,
                                 neuron_target=instance_type.split(".")[0])
        asked = get_platform("neuron").worker_resources(trial)
        markers = [key for key in asked if key.startswith("instance_type:")]
        assert markers and all(node_type["resources"].get(key, 0) >= asked[key] for key in markers), name
        # ...and no other Neuron type offers it.
        for other_name, other in workers(config).items():
            if other_name != name:
                assert not set(markers) & set(other["resources"]), (name, other_name)
        assert 0 < node_type["max_workers"] <= config["max_workers"], name


def test_every_node_boots_the_same_pytorch_29_neuron_dlami(config):
    images = {t["node_config"]["ImageId"] for t in node_types(config).values()}
    assert len(images) == 1, images
    (image,) = images
    assert image == config["metadata"]["neuron_dlami_image_id"]
    pinned = re.fullmatch(r"ami-[0-9a-f]{8,17}", image)
    resolved = image.startswith("resolve:ssm:/aws/service/neuron/dlami/pytorch-2.9/")
    assert pinned or resolved, image
    assert "multi-framework" not in image  # from SDK 2.32 on it has no PyTorch venv


def test_no_credentials(text, config):
    secret_like = [
        r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",  # access key ids
        r"aws_secret_access_key", r"aws_access_key_id", r"aws_session_token",
        r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
        r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",  # a secret access key's shape
    ]
    for number, line in enumerate(text.splitlines(), 1):
        for pattern in secret_like:
            assert not re.search(pattern, line, re.IGNORECASE if "_" in pattern else 0), (number, line)
    assert "aws_credentials" not in config["provider"]
    assert "ssh_private_key" not in config.get("auth", {})


def pip_installs(command: str):
    """Each `pip install ...` in a shell command, as its argument list (up to the next
    shell operator)."""
    words = shlex.split(command.replace(";", " ; "), posix=True)
    for i, word in enumerate(words):
        if word == "install" and i > 0 and words[i - 1] in ("pip", "pip3"):
            args = []
            for arg in words[i + 1:]:
                if arg in (";", "&&", "||", "|", ">", ">>"):
                    break
                args.append(arg)
            yield args


def requirement_name(arg: str) -> str:
    return re.split(r"[\[<>=!~ @;]", arg, maxsplit=1)[0].lower().replace("_", "-")


def test_setup_commands_never_install_torch(config):
    installs = [args for command in all_commands(config) for args in pip_installs(command)]
    assert installs, "no pip install found: the parser no longer sees the setup commands"
    for args in installs:
        assert not {"-U", "--upgrade", "--force-reinstall", "-r", "--requirement"} & set(args), args
        options_with_value = {"-c", "--constraint", "-e", "--editable", "-i", "--index-url", "--extra-index-url"}
        requirements, editable, skip = [], [], False
        for j, arg in enumerate(args):
            if skip:
                skip = False
                continue
            if arg in options_with_value:
                skip = True
                if arg in ("-e", "--editable"):
                    editable.append(args[j + 1])
                continue
            if not arg.startswith("-"):
                requirements.append(arg)
        names = {requirement_name(r) for r in requirements}
        assert not names & TORCH_STACK, args
        no_deps = "--no-deps" in args
        if editable or any(r.startswith((".", "/", "~")) for r in requirements):
            assert no_deps, f"the project must be installed with --no-deps: {args}"
        if names & DEPENDS_ON_TORCH:
            assert no_deps, f"{names & DEPENDS_ON_TORCH} depend on torch; install with --no-deps: {args}"
        if not no_deps:
            # Whatever pip resolves must leave the venv's torch stack as recorded.
            assert "-c" in args or "--constraint" in args, args


def test_everything_runs_in_the_dlamis_pytorch_29_venv(text, config):
    venv = config["metadata"]["neuron_venv"]
    assert venv == "/opt/aws_neuronx_venv_pytorch_2_9"
    assert set(re.findall(r"/opt/aws_neuronx_venv_[A-Za-z0-9_]+", text)) == {venv}
    for command in config["head_start_ray_commands"] + config["worker_start_ray_commands"]:
        assert f"{venv}/bin/ray " in command, command
    for command in all_commands(config):
        for args in pip_installs(command):
            assert f"{venv}/bin/python -m pip install" in command, command
    assert any(f"source {venv}/bin/activate" in c for c in config["setup_commands"])


def test_the_repository_is_mounted_where_it_is_installed_from(config):
    assert config["file_mounts"].get("~/accelsweep") == "."
    assert any("--no-deps -e ~/accelsweep" in c for c in config["setup_commands"])
    for excluded in (".venv", "mlflow.db", ".git"):
        assert excluded in config["rsync_exclude"], excluded


def test_servers_bind_to_localhost(text, config):
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start
    code = [line.split("#", 1)[0] for line in text.splitlines()]
    assert not any("0.0.0.0" in line for line in code)


KEY_LINE = re.compile(r'^(\s*)(?:-\s+)?(?:"[^"]+"|[A-Za-z_][A-Za-z0-9_.\-]*)\s*:(?:\s|$)')


def test_every_key_is_commented(text):
    """Each key has a comment on its own line or on the line right above it."""
    lines = text.splitlines()
    in_block_scalar, block_indent = False, 0
    missing = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if in_block_scalar:
            if stripped and indent <= block_indent:
                in_block_scalar = False
            else:
                continue
        if not stripped or stripped.startswith("#"):
            continue
        if re.search(r":\s*[>|][-+]?\s*$", line) or re.match(r"^\s*-\s+[>|][-+]?\s*$", line):
            in_block_scalar, block_indent = True, indent
        if not KEY_LINE.match(line):
            continue
        previous = lines[number - 2].strip() if number > 1 else ""
        if " #" not in line and not previous.startswith("#"):
            missing.append((number, line))
    assert not missing, missing
