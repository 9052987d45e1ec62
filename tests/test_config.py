"""The config vocabulary: defaults from Goyal et al., validation with one-line errors, round trips."""

import dataclasses
import math
import os

import pytest
import yaml

from lbsgd import config, registry
from lbsgd.config import Config, ConfigError, derive
from lbsgd.data import sampler


def test_defaults_are_goyal_2017():
    c = Config()
    assert (c.base_lr, c.reference_batch, c.bn_batch, c.momentum, c.nesterov) == (
        0.1,
        256,
        32,
        0.9,
        True,
    )
    assert (c.weight_decay, c.warmup, c.warmup_epochs) == (1e-4, "gradual", 5.0)
    assert (c.schedule, c.milestones, c.decay_factor, c.epochs) == ("step", (30, 60, 80), 0.1, 90)
    assert c.zero_init_residual is True


def test_config_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().batch_size = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("overrides", "key", "fragment"),
    [
        (["batchsize=64"], "batchsize", "did you mean 'batch_size'"),
        (["warmup=linear"], "warmup", "'none', 'constant' or 'gradual'"),
        (["batch_size=1000"], "batch_size", "not a multiple of bn_batch=32"),
        (["base_lr=-0.1"], "base_lr", "must be >= 0"),
        (["dataset=cifar10"], "data_dir", "required for dataset=cifar10"),
        (["dataset=imagenet", "data_dir=/no/such/dir"], "data_dir", "does not exist"),
        (["batch_size=abc"], "batch_size", "valid integer"),
        (["momentum=1.5"], "momentum", "[0, 1)"),
        (["nesterov=maybe"], "nesterov", "valid boolean"),
        (["lr_scaling=cubic"], "lr_scaling", "'linear', 'sqrt' or 'none'"),
        (["schedule=exp"], "schedule", "'step', 'poly' or 'cosine'"),
        (["milestones=60,30"], "milestones", "increasing order"),
        (["micro_batch=48"], "micro_batch", "not a multiple of bn_batch=32"),
        (["depth=21"], "depth", "6n+2"),
        (["epochs=0"], "epochs", "must be > 0"),
        (["warmup_epochs=-1"], "warmup_epochs", ">= 0"),
        (["name=a/b"], "name", "plain folder name"),
        (["batch_size"], "batch_size", "not key=value"),
        (["pool5_bn=true"], "pool5_bn", "applies to model=alexnet or alexnet_bn"),
        (["optimizer=adam"], "optimizer", "'sgd', 'lars', 'lamb' or 'adamw'"),
        (["optimizer=lamb", "adam_beta2=1"], "adam_beta2", "must be in [0, 1)"),
        (["optimizer=adamw", "adam_eps=0"], "adam_eps", "must be > 0"),
        (["adam_beta1=0.8"], "adam_beta1", "has no effect unless optimizer=lamb or adamw"),
        (["precision=fp8"], "precision", "'fp32', 'fp16' or 'bf16'"),
        (["lars_eta=0"], "lars_eta", "must be > 0"),
    ],
)
def test_invalid_config_stops_with_one_line_naming_the_key(overrides, key, fragment):
    with pytest.raises(ConfigError) as err:
        config.load(overrides=overrides)
    msg = str(err.value)
    assert "\n" not in msg
    assert key in msg and fragment in msg, msg


def test_hardware_mapping_that_cannot_be_exact_is_refused():
    c = Config(batch_size=256, bn_batch=32)
    with pytest.raises(
        ConfigError, match=r"batch_size=256 is not a multiple of world_size \* micro_batch"
    ):
        derive(c, world_size=3, num_train=1000)
    assert derive(c, world_size=4, num_train=1000).accum_steps == 2  # 256 / (4 * 32)


def test_overrides_are_typed_by_the_schema():
    c = config.load(
        overrides=[
            "batch_size=8192",
            "nesterov=false",
            "milestones=[10, 20]",
            "warmup_lr=null",
            "base_lr=1e-3",
        ]
    )
    assert (c.batch_size, c.nesterov, c.milestones, c.warmup_lr, c.base_lr) == (
        8192,
        False,
        (10.0, 20.0),
        None,
        0.001,
    )


def test_yaml_files_then_overrides_later_wins(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("batch_size: 512\nwarmup: constant\n")
    b = tmp_path / "b.yaml"
    b.write_text("warmup: none\n")
    c = config.load([a, b], ["batch_size=1024"])
    assert (c.batch_size, c.warmup) == (1024, "none")


def test_yaml_with_unknown_key_is_refused(tmp_path):
    f = tmp_path / "bad.yaml"
    f.write_text("batch_size: 512\nwarmpu: none\n")
    with pytest.raises(ConfigError, match="unknown key 'warmpu' \\(did you mean 'warmup'\\?\\)"):
        config.load([f])


def test_dump_then_load_round_trips_every_key_and_keeps_derived_values(tmp_path):
    c = config.load(overrides=["batch_size=2048", "warmup=constant", "milestones=1,2.5", "seed=7"])
    d = derive(c, world_size=2, num_train=50_000)
    f = tmp_path / "config.yaml"
    f.write_text(config.dump(c, d))
    assert config.load([f]) == c
    raw = yaml.safe_load(f.read_text())
    assert raw["lr"] == pytest.approx(0.8) and raw["accum_steps"] == 32 and raw["world_size"] == 2


def test_micro_batch_is_the_keys_in_a_file_and_in_a_runs_config_yaml(tmp_path):
    """``micro_batch`` is a key and a derived value: a config file's micro_batch is kept (it was
    once dropped as a derived value), and a run's config.yaml gives back its key (auto), not the
    micro-batch derived from it (16), unless the derived values are asked for."""
    f = tmp_path / "mine.yaml"
    f.write_text("batch_size: 128\nbn_batch: 16\nmicro_batch: 32\n")
    assert config.load([f]).micro_batch == 32
    c = config.load(overrides=["batch_size=128", "bn_batch=16", "micro_batch=auto"])
    run = tmp_path / "config.yaml"
    run.write_text(config.dump(c, derive(c, world_size=2, num_train=1024, micro=16)))
    assert config.load([run]) == c and config.load([run]).micro_batch == "auto"
    assert config.read_yaml(run, derived=True)["micro_batch"] == 16


def test_run_name_is_stable_and_tracks_experiment_keys_only():
    a = Config(batch_size=512)
    assert a.run_name() == Config(batch_size=512).run_name()
    assert a.experiment_id() == Config(batch_size=512, workers=4, micro_batch=64).experiment_id()
    assert a.experiment_id() != Config(batch_size=512, seed=1).experiment_id()


def test_every_key_documents_its_kind_and_meaning():
    text = config.describe_keys()
    for f in dataclasses.fields(Config):
        assert f.metadata["kind"] in ("experiment", "hardware", "run")
        assert len(f.metadata["help"]) > 10
        assert f.name in text


def test_keys_added_later_leave_earlier_run_ids_unchanged_until_set():
    # 7e6ebad0 is the default config's id before the fake_* keys existed: committed run names
    # end in such ids, so a new key at its default must not change any of them
    assert Config().experiment_id() == "7e6ebad0"
    assert Config(fake_classes=1000).experiment_id() == "7e6ebad0"  # the default, given
    # each later key set off its default (with the keys it needs), against the same config with
    # the key at its default
    off_default = {
        "staleness_dist": {"staleness": 1, "staleness_dist": "uniform"},
        "block_momentum": {"local_sgd": 2, "block_momentum": 0.5},
        "block_lr": {"local_sgd": 2, "block_lr": 2.0},
        "block_nesterov": {"local_sgd": 2, "block_nesterov": False},
        "fashion_size": {"fashion_size": 14},  # 29 is out of range
        "fashion_train": {"fashion_train": 20_000},
        "switch_step": {"local_sgd": 2, "switch_step": 3},
        "adam_beta1": {"optimizer": "lamb", "adam_beta1": 0.8},
        "adam_beta2": {"optimizer": "lamb", "adam_beta2": 0.99},
        "adam_eps": {"optimizer": "adamw", "adam_eps": 1e-8},
        "adapt_bn_bias": {"optimizer": "lars", "adapt_bn_bias": True},
        "stop_at_error": {"stop_at_error": 20.0},
        "grad_clip": {"grad_clip": 1.0},
    }
    for key in config.HASHED_ONLY_OFF_DEFAULT:
        keys = off_default[key] if key in off_default else {key: getattr(Config(), key) + 1}
        base = Config(**{k: v for k, v in keys.items() if k != key})
        assert Config(**keys).experiment_id() != base.experiment_id(), key


@pytest.mark.parametrize(
    ("value", "plain"),
    [
        ("n" * config.MAX_FOLDER_NAME_BYTES, True),  # with ".log" appended: 255 bytes, the limit
        ("n" * (config.MAX_FOLDER_NAME_BYTES + 1), False),
        ("é" * (config.MAX_FOLDER_NAME_BYTES // 2 + 1), False),  # 2 bytes each in UTF-8
        ("run 1", True),
        (" run", False),
        ("run\t", False),
        ("run\n", False),
    ],
)
def test_a_folder_name_fits_the_file_system_with_its_log_and_hides_no_space(value, plain):
    if plain:
        config.check_folder_name("name", value)
        assert config.from_dict({"name": value}).run_dir().name == value
        return
    for check in (
        lambda: config.check_folder_name("name", value),
        lambda: config.from_dict({"name": value}),
    ):
        with pytest.raises(ConfigError) as err:
            check()
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"name={value!r}") and "plain folder name" in msg


@pytest.mark.parametrize(
    ("project", "valid"),
    [("lbsgd", True), ("my project-2", True), ("p" * 128, True), ("p" * 129, False)]
    + [("", False)]
    + [(f"team{ch}lbsgd", False) for ch in "/\\#?%:"],
)
def test_wandb_project_is_refused_before_the_run_where_wandb_would_refuse_it(project, valid):
    if valid:
        assert Config(wandb_project=project).wandb_project == project
        return
    with pytest.raises(ConfigError) as err:
        config.from_dict({"wandb_project": project})
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"wandb_project={project!r}"), msg
    assert "W&B project name" in msg


@pytest.mark.parametrize("key", ["out_dir", "data_dir"])
def test_a_chosen_folder_may_be_absolute_but_holds_no_nul(key, tmp_path):
    assert getattr(Config(**{key: str(tmp_path)}), key) == str(tmp_path)
    with pytest.raises(ConfigError, match=rf"^{key}='.*\\x00.*' holds a NUL character"):
        config.from_dict({key: f"{tmp_path}/a\0b"})


@pytest.mark.parametrize(
    ("text", "error"),
    [("import no_such_module_here\n", "cannot import"), ("1 / 0\n", "raised ZeroDivisionError")],
)
def test_a_plugin_file_that_fails_fails_the_same_way_when_tried_again(tmp_path, text, error):
    """Not left half-imported: the second import runs the file again instead of finding a module
    that never finished."""
    plugin = tmp_path / "failing_plugin.py"
    plugin.write_text(text)
    for _ in range(2):
        with pytest.raises(ConfigError) as err:
            registry.import_plugins([str(plugin)])
        msg = str(err.value)
        assert msg.startswith("plugins: ") and str(plugin) in msg and error in msg, msg


@pytest.mark.parametrize(
    ("out_dir", "study", "name", "key"),
    [
        ("afile", "runs", "r", "out_dir"),
        ("afile/deeper", "runs", "r", "out_dir"),
        (".", "afile", "r", "study"),
        (".", "runs", "afile", "name"),
    ],
)
def test_check_place_names_the_key_whose_folder_on_the_way_is_a_file(
    tmp_path, monkeypatch, out_dir, study, name, key
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("x")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "afile").write_text("x")
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(ConfigError) as err:
        config.check_place(out_dir, study, name)
    message = str(err.value)
    assert message.startswith(f"{key}=") and "exists and is not a folder" in message, message
    assert "\n" not in message and sorted(tmp_path.rglob("*")) == before  # nothing made


def test_check_place_asks_write_access_only_where_a_folder_is_to_be_made(tmp_path, monkeypatch):
    (tmp_path / "runs" / "done").mkdir(parents=True)
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)  # nothing can be written
    config.check_place(tmp_path, "runs", "done")  # an existing run folder is read, not written
    with pytest.raises(ConfigError, match=r"^out_dir=.*runs' cannot be written in"):
        config.check_place(tmp_path, "runs", "new")
    with pytest.raises(ConfigError, match=r"^out_dir=.* cannot be written in"):
        config.check_place(tmp_path / "new", "runs")


@pytest.mark.parametrize("key", ["out_dir", "data_dir"])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_folder_path_is_refused_not_taken_for_the_working_directory(key, value):
    with pytest.raises(ConfigError, match=rf"^{key}={value!r} is empty \(valid: a folder path"):
        config.from_dict({key: value})
    if key == "out_dir":
        with pytest.raises(ConfigError, match=rf"^out_dir={value!r} is empty"):
            config.check_place(value, "runs")


@pytest.mark.parametrize("epochs", [0.5, 90.0, 1e6])
def test_the_largest_seed_accepted_seeds_every_epoch_of_the_data_order_and_one_more_is_refused(
    epochs,
):
    last_epoch = math.ceil(epochs) + 1  # the sampler may draw the order of the epoch after the end
    largest = (2**64 - 1 - last_epoch) // 1_000_003
    Config(seed=largest, epochs=epochs)
    sampler.permutation(4, largest, last_epoch)  # torch takes the data order's seed
    with pytest.raises(ConfigError, match=rf"^seed={largest + 1} is too large"):
        config.from_dict({"seed": largest + 1, "epochs": epochs})


def test_the_layout_is_a_check_and_its_accumulation_steps_a_value():
    c = Config(batch_size=256, bn_batch=32)
    assert config.check_world(c, 2) is None
    assert config.accum_steps(c, 2) == 4 and config.accum_steps(c, 2, micro=64) == 2
    assert derive(c, 2, 1000).accum_steps == config.accum_steps(c, 2)
    bad = r"^batch_size=256 is not a multiple of world_size \* micro_batch = 3 \* 32 = 96$"
    with pytest.raises(ConfigError, match=bad):
        config.check_world(c, 3)
    with pytest.raises(ConfigError, match=bad):  # derive checks the layout before any value
        derive(c, 3, 1000)
    auto = c.replace(micro_batch="auto")  # the largest candidate: the whole share
    assert config.accum_steps(auto, 2) == 1 and derive(auto, 2, 1000).micro_batch == 128
    ps = c.replace(async_ps=True)  # one update = one worker's batch, whatever the world size
    assert config.accum_steps(ps, 4) == config.accum_steps(c, 1) == 8


def test_values_derived_after_runs_were_committed_stay_out_of_config_yaml():
    c = Config(batch_size=512, micro_batch=64, noise_scale=True, noise_scale_batch=128)
    d = derive(c, 2, 50_000)
    assert (d.bn_groups, d.noise_micro_batches, d.switch_step) == (16, 2, d.warmup_steps)
    assert derive(Config(), 1, 50_000).noise_micro_batches is None
    unrecorded = {"bn_groups", "noise_micro_batches", "switch_step"}
    assert unrecorded.isdisjoint(config.DERIVED_KEYS) and list(d.to_dict()) == list(
        config.DERIVED_KEYS
    )
    keys, derived = config.dump(c, d).split("# derived (lbsgd.config.derive)\n")
    assert unrecorded.isdisjoint(yaml.safe_load(derived))
    assert yaml.safe_load(keys)["switch_step"] is None  # the key itself, as every key


def test_switch_step_is_where_local_sgd_and_powersgd_take_over_and_null_the_warmups_end():
    local = Config(local_sgd=2)
    d = derive(local, 2, 50_000)
    assert d.switch_step == d.warmup_steps == 977  # round(5 epochs * 50000 / 256)
    assert derive(local.replace(switch_step=10), 2, 50_000).switch_step == 10
    assert derive(local.replace(warmup="none"), 2, 50_000).switch_step == 0
    assert derive(Config(comm_hook="powersgd", switch_step=0), 2, 50_000).switch_step == 0
    assert config.load(overrides=["local_sgd=2", "switch_step=null"]) == local
    # the run's name is the one it had before the key existed, until the key is set
    assert local.replace(switch_step=977).run_name() != local.run_name()
    for keys, match in [
        (
            {"switch_step": 5},
            r"^switch_step=5 has no effect unless local_sgd > 0 or comm_hook=powersgd",
        ),
        ({"local_sgd": 2, "switch_step": -1}, r"^switch_step=-1 must be >= 0$"),
        ({"local_sgd": 2, "switch_step": 1.5}, r"^switch_step=1.5: "),
    ]:
        with pytest.raises(ConfigError, match=match) as err:
            config.from_dict(keys)
        assert "\n" not in str(err.value)


# a value other than the default of every key that only one setting reads, and that setting
_IGNORED_EXAMPLES = {
    "lars_eta": ("0.002", "optimizer=lars"),
    "adam_beta1": ("0.8", "optimizer=adamw"),
    "adam_beta2": ("0.99", "optimizer=lamb"),
    "adam_eps": ("1e-8", "optimizer=adamw"),
    "momentum": ("0.8", "optimizer=sgd"),
    "nesterov": ("false", "optimizer=sgd"),
    "momentum_correction": ("false", "optimizer=sgd"),
    "milestones": ("10,20", "schedule=step"),
    "decay_factor": ("0.5", "schedule=step"),
    "poly_power": ("3", "schedule=poly"),
    "warmup_epochs": ("1", "warmup=gradual"),
    "warmup_lr": ("0.01", "warmup=constant"),
    "loss_scale": ("1024", "precision=fp16"),
    "staleness_dist": ("uniform", "staleness=2"),
    "powersgd_rank": ("2", "comm_hook=powersgd"),
    "adapt_bn_bias": ("true", "optimizer=lamb"),
    "block_momentum": ("0.5", "local_sgd=2"),
    "block_lr": ("0.5", "local_sgd=2"),
    "block_nesterov": ("false", "local_sgd=2"),
    "switch_step": ("5", "comm_hook=powersgd"),
    "noise_scale_batch": ("16", "noise_scale=true"),
    "noise_scale_ema": ("0.9", "noise_scale=true"),
    "synthetic_train": ("1000", "dataset=synthetic"),
    "synthetic_test": ("100", "dataset=synthetic"),
    "synthetic_difficulty": ("easy", "dataset=synthetic"),
    "synthetic_noise": ("0.1", "dataset=synthetic"),
    "fake_train": ("100", "dataset=fake"),
    "fake_test": ("10", "dataset=fake"),
    "fake_image_size": ("64", "dataset=fake"),
    "fake_classes": ("10", "dataset=fake"),
    "fashion_size": ("14", "dataset=fashion_mnist"),
    "fashion_train": ("1000", "dataset=fashion_mnist"),
    "stop_at_error": ("20", "eval_every=1"),
}
# a setting under which each key above is ignored
_OFF = {
    "optimizer=lars": "optimizer=sgd",
    "optimizer=adamw": "optimizer=sgd",
    "optimizer=lamb": "optimizer=sgd",
    "optimizer=sgd": "optimizer=adamw",
    "schedule=step": "schedule=cosine",
    "schedule=poly": "schedule=step",
    "warmup=gradual": "warmup=none",
    "warmup=constant": "warmup=none",
    "precision=fp16": "precision=fp32",
    "staleness=2": "staleness=0",
    "comm_hook=powersgd": "comm_hook=none",
    "local_sgd=2": "local_sgd=0",
    "noise_scale=true": "noise_scale=false",
    "dataset=synthetic": "dataset=fake",
    "dataset=fake": "dataset=synthetic",
    "dataset=fashion_mnist": "dataset=synthetic",
    "eval_every=1": "eval_every=0",  # and eval_per_octave's default, 0: no evaluation before the end
}


def test_a_key_its_setting_ignores_is_refused_in_one_line_and_accepted_where_it_is_read():
    from lbsgd.config.checks import USED_ONLY_WHEN

    listed = {k for keys, _, _, _ in USED_ONLY_WHEN for k in keys}
    assert listed == set(_IGNORED_EXAMPLES)  # every rule's key has an example here
    defaults = config.load().to_dict()
    for key, (value, on) in _IGNORED_EXAMPLES.items():
        c = config.load(overrides=[on, f"{key}={value}"])  # read there: accepted
        assert c.to_dict()[key] != defaults[key], key
        with pytest.raises(ConfigError) as err:
            config.load(overrides=[_OFF[on], f"{key}={value}"])
        msg = str(err.value)
        assert "\n" not in msg and msg.startswith(f"{key}=") and "has no effect unless" in msg, msg
        # its default, given explicitly where the key is ignored, changes nothing: accepted
        default = defaults[key]
        if isinstance(default, list | tuple):
            shown = ",".join(map(str, default))
        else:
            shown = "null" if default is None else default
            shown = str(default).lower() if isinstance(default, bool) else shown
        assert config.load(overrides=[_OFF[on], f"{key}={shown}"]).to_dict()[key] == default


def test_a_list_key_written_as_a_string_in_yaml_reads_as_on_the_command_line(tmp_path):
    """``plugins: my_models.py`` (and ``milestones: 30,60``) in a YAML file are what
    ``plugins=my_models.py`` and ``milestones=30,60`` are on the command line, as a list is."""
    (tmp_path / "my_models.py").write_text("X = 1\n")
    plugin = str(tmp_path / "my_models.py")
    for text in (
        f"plugins: {plugin}\nmilestones: 30,60\n",
        f"plugins: [{plugin}]\nmilestones: [30, 60]\n",
    ):
        (tmp_path / "c.yaml").write_text(text)
        from_yaml = config.load([tmp_path / "c.yaml"])
        from_line = config.load([], [f"plugins={plugin}", "milestones=30,60"])
        assert (from_yaml.plugins, from_yaml.milestones) == ((plugin,), (30.0, 60.0))
        assert (from_yaml.plugins, from_yaml.milestones) == (
            from_line.plugins,
            from_line.milestones,
        )
