"""The one dotted-path loader: both forms, slime's dotted-only form, and errors that name the path."""

from __future__ import annotations

import json

import pytest

from aclarena_slime.dotted import DottedPathError, load_dotted


def test_both_forms_load_the_same_object():
    assert load_dotted("json.dumps") is load_dotted("json:dumps") is json.dumps


def test_slimes_form_takes_no_colon():
    with pytest.raises(DottedPathError, match="'package.module.name', got 'json:dumps'"):
        load_dotted("json:dumps", colon=False)


@pytest.mark.parametrize("path", ["nodots", ":dumps", "json:", "json."])
def test_a_path_naming_nothing_is_refused_by_name(path):
    with pytest.raises(DottedPathError, match=repr(path).replace(".", r"\.")):
        load_dotted(path)


def test_import_and_attribute_errors_reach_the_caller():
    with pytest.raises(ModuleNotFoundError):
        load_dotted("no_such_module_anywhere.fn")
    with pytest.raises(AttributeError):
        load_dotted("json.no_such_function")
