"""wlb.Packer's keyword arguments are the plan settings table (wlb::kPlanSettings): these tests
iterate wlb.plan_settings(), so a new row is tested without a new test."""
import pytest

import wlb

PROFILE = "length,ms\n1024,0.5\n4096,2.5\n16384,20.0\n65536,240.0\n131072,900.0\n"


def python_value(row):
    """The row's example text as the Python value wlb.Packer takes."""
    text, kind = row["example"], row["type"]
    if kind == "int":
        return int(text)
    if kind == "number":
        return float(text)
    if kind == "bool":
        assert text in ("true", "false")
        return text == "true"
    if kind == "int list":
        return [] if text == "none" else [int(v) for v in text.split(",")]
    if kind == "range":
        return text if text == "exact" else tuple(float(v) for v in text.split(","))
    assert kind == "string", kind
    return text


def reader(row):
    return row["readers"][0] if row["readers"] else "wlb"


def test_the_table_is_the_keyword_arguments():
    rows = wlb.plan_settings()
    keys = [row["key"] for row in rows]
    assert len(keys) == len(set(keys)) and {"context", "thresholds", "window"} <= set(keys)
    doc = wlb.Packer.__init__.__doc__
    for row in rows:
        assert row["example"] != row["default"], row
        assert set(row["readers"]) <= set(wlb.packer_names()), row
        assert f"\n{row['key']} ({row['type']}, default " in doc, row["key"]


@pytest.mark.parametrize("row", wlb.plan_settings(), ids=lambda row: row["key"])
def test_every_keyword_argument_round_trips(row, tmp_path):
    kwargs = {row["key"]: python_value(row)}
    if row["key"] == "profile_cost":  # read only with a profile CSV in cost
        profile = tmp_path / "profile.csv"
        profile.write_text(PROFILE)
        kwargs["cost"] = str(profile)
    packer = wlb.Packer(reader(row), **kwargs)
    assert packer.settings[row["key"]] == row["example"]
    assert wlb.Packer(reader(row), **{row["key"]: None}).settings == {}  # None: the default


@pytest.mark.parametrize("row", [r for r in wlb.plan_settings() if r["readers"]],
                         ids=lambda row: row["key"])
def test_an_option_no_packer_of_the_run_reads_is_the_one_error(row):
    flag = row["key"].replace("_", "-")
    for name in wlb.packer_names():
        if name in row["readers"]:
            continue
        with pytest.raises(ValueError,
                           match=f"^--{flag} is not used by this run: only .*, and the packer is "
                                 f"'{name}'$") as error:
            wlb.Packer(name, context=65536, **{row["key"]: python_value(row)})
        for name_reading in row["readers"]:
            assert name_reading in str(error.value)


def test_unknown_keyword_and_wrong_type_are_type_errors():
    with pytest.raises(TypeError, match="unexpected keyword argument 'windw'.*window"):
        wlb.Packer("fixed-greedy", windw=2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'tune'"):
        wlb.Packer("wlb", tune=True)  # a wlb-plan flag, not a keyword argument
    with pytest.raises(TypeError, match="Packer\\(\\): window must be an int, got '2'"):
        wlb.Packer("fixed-greedy", window="2")
    with pytest.raises(TypeError, match="bound_delay must be a bool, got 1"):
        wlb.Packer("wlb-lookahead", bound_delay=1)
    with pytest.raises(TypeError, match="thresholds must be a list of ints"):
        wlb.Packer("wlb", thresholds="1000")
