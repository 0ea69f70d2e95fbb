import os
import re

import pytest

from cluster.protocol.auth import create_secret, load_secret


def test_secret_is_private_and_loads(tmp_path):
    path = tmp_path / "secret"
    secret = create_secret(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert load_secret(path) == secret and len(secret) == 32


def test_readable_secret_is_refused(tmp_path):
    path = tmp_path / "secret"
    create_secret(path)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="0600"):
        load_secret(path)


def test_missing_secret_says_how_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="streamlab cluster start"):
        load_secret(tmp_path / "nope")


@pytest.mark.parametrize("text, says", [("", "is empty: make one with `streamlab jobmanager create-secret"),
                                        ("zz" * 16, "is not a hex string"), ("ab" * 4, "is too short")])
def test_a_bad_secret_is_named_with_what_is_wrong(tmp_path, text, says):
    path = tmp_path / "secret"
    path.write_text(text)
    path.chmod(0o600)
    with pytest.raises(ValueError, match=re.escape(f"cluster secret {path} {says}")):
        load_secret(path)
