"""Config: packaged defaults, site overlay, and errors that name the file and key path."""

from __future__ import annotations

import pytest

from gpugate.config import ConfigError, load_config


def write(tmp_path, text: str) -> str:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return str(path)


def test_packaged_defaults_load_and_hold_the_documented_values():
    config = load_config("/dev/null")
    assert config.checks.gpu.temperature_max_c == 85.0
    assert config.checks.gpu.ecc_aggregate_uncorrected_max == 100
    assert config.checks.host.nofile_min == 1048576
    assert config.boards["h100-sxm-8"].nvlinks_per_gpu == 18
    assert config.boards["a100-sxm-8"].nvlinks_per_gpu == 12
    assert config.boards["v100-sxm2-8"].nvlinks_per_gpu == 6
    assert config.policy.unknown == "warn"


def test_site_file_overrides_only_what_it_names(tmp_path):
    path = write(tmp_path, "checks:\n  gpu:\n    temperature_max_c: 80\n")
    config = load_config(path)
    assert config.checks.gpu.temperature_max_c == 80.0
    assert config.checks.gpu.ecc_aggregate_uncorrected_max == 100  # untouched default


def test_site_board_is_added_next_to_packaged_ones(tmp_path):
    path = write(
        tmp_path,
        "boards:\n  b200-8:\n    match: [B200]\n    gpu_count: 8\n    nvlinks_per_gpu: 18\n"
        "    pcie_gen: 5\n    pcie_width: 16\n    ib_ports: 8\n    ib_rate_gbps: 400\n"
        "    nvswitch: true\n",
    )
    config = load_config(path)
    assert "b200-8" in config.boards and "h100-sxm-8" in config.boards


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("checks:\n  gpu:\n    temprature_max_c: 80\n", "checks.gpu.temprature_max_c: unknown key"),
        (
            "checks:\n  gpu:\n    temperature_max_c: hot\n",
            "checks.gpu.temperature_max_c: expected float",
        ),
        ("policy:\n  unknown: maybe\n", "policy.unknown: 'maybe' is not one of ok, warn, fail"),
        ("checks:\n  disabled: gpu.ecc\n", "checks.disabled: expected a list"),
        (
            "checks:\n  disabled: [gpu.eccc]\n",
            "checks.disabled[0]: unknown check 'gpu.eccc' (known: gpu.count, gpu.lost,",
        ),
        (
            "policy:\n  warn_only: [gpu.ecc, ib.port]\n",
            "policy.warn_only[1]: unknown check 'ib.port' (known: ",
        ),
        ("sources:\n  timeout_s:\n    nvml: -1\n", "sources.timeout_s.nvml: must not be negative"),
        (
            "health:\n  suspect_qualify_per_user_per_day: 0\n",
            "health.suspect_qualify_per_user_per_day: must be at least 1, got 0",
        ),
        (
            "health:\n  suspect_qualify_per_user_per_day: many\n",
            "health.suspect_qualify_per_user_per_day: expected int",
        ),
        ("checks:\n  host:\n    nofile_min: true\n", "checks.host.nofile_min: expected int"),
        ("- a list\n", "expected a mapping at the top"),
        ("checks: [\n", "not valid YAML"),
    ],
)
def test_bad_site_config_is_refused_naming_file_and_key(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert expected in str(err.value)
    assert "site.yaml" in str(err.value)


def test_explicit_missing_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "nope.yaml"))


def test_env_variable_names_the_site_file(tmp_path, monkeypatch):
    path = write(tmp_path, "facts_file: /tmp/{node}.yaml\n")
    monkeypatch.setenv("GPUGATE_CONFIG", path)
    assert load_config().facts_file == "/tmp/{node}.yaml"


def test_missing_default_site_file_means_packaged_defaults(monkeypatch):
    import gpugate.config as cfg

    monkeypatch.setattr(cfg, "DEFAULT_SITE_FILE", "/nonexistent/gpugate.yaml")
    assert load_config().checks.gpu.temperature_max_c == 85.0


def test_cached_parse_follows_file_changes(tmp_path):
    path = write(tmp_path, "checks:\n  gpu:\n    temperature_max_c: 70\n")
    assert load_config(path).checks.gpu.temperature_max_c == 70.0
    (tmp_path / "site.yaml").write_text("checks:\n  gpu:\n    temperature_max_c: 75\n")
    assert load_config(path).checks.gpu.temperature_max_c == 75.0
