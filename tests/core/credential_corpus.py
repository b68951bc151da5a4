"""Fake credentials of the shapes issuers document, built at run time so that this repository
itself never holds a string a scanner would flag (every prefix is split by concatenation).

The values are random from a seeded generator: shaped and random like real ones, valid nowhere.
"""

from __future__ import annotations

import base64
import hashlib
import json
import random
import string
from urllib.parse import quote

__all__ = ["BENIGN", "CREDENTIALS"]

_rng = random.Random(20261203)
ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64 = ALNUM + "+/"
HEX = "0123456789abcdef"


def r(alphabet: str, n: int) -> str:
    return "".join(_rng.choice(alphabet) for _ in range(n))


def b64(n_bytes: int) -> str:
    return base64.b64encode(_rng.randbytes(n_bytes)).decode()


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _pem(label: str) -> str:
    body = "\n".join(b64(48) for _ in range(3))
    return f"-----BEGIN {label}-----\n{body}\n-----END {label}-----\n"


_PK = "PRIVATE" + " KEY"
_PASSWORD = r(ALNUM, 14) + "!9"
_JWT = ".".join(
    [
        b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode()),
        b64url(json.dumps({"sub": "1234567890", "name": "svc"}).encode()),
        b64url(_rng.randbytes(32)),
    ]
)

CREDENTIALS: list[tuple[str, str]] = [
    ("aws_access_key_id", "AK" + "IA" + r(UPPER_DIGITS, 16)),
    ("aws_temporary_key_id", "AS" + "IA" + r(UPPER_DIGITS, 16)),
    ("aws_secret_access_key_bare", r(B64, 40)),
    ("aws_secret_access_key_assigned", "aws_secret_" + "access_key = " + r(B64, 40)),
    ("github_classic_pat", "gh" + "p_" + r(ALNUM, 36)),
    ("github_oauth_token", "gh" + "o_" + r(ALNUM, 36)),
    ("github_app_token", "gh" + "s_" + r(ALNUM, 36)),
    ("github_fine_grained_pat", "github" + "_pat_11" + r(UPPER_DIGITS, 20) + "_" + r(ALNUM, 59)),
    ("gitlab_pat", "gl" + "pat-" + r(ALNUM, 20)),
    (
        "slack_bot_token",
        "xo" + "xb-" + r(string.digits, 12) + "-" + r(string.digits, 13) + "-" + r(ALNUM, 24),
    ),
    (
        "slack_webhook_url",
        "https://hooks."
        + "slack.com/services/T"
        + r(UPPER_DIGITS, 8)
        + "/B"
        + r(UPPER_DIGITS, 8)
        + "/"
        + r(ALNUM, 24),
    ),
    ("stripe_live_secret_key", "sk" + "_live_" + r(ALNUM, 24)),
    ("stripe_restricted_key", "rk" + "_live_" + r(ALNUM, 24)),
    ("stripe_webhook_secret", "wh" + "sec_" + r(ALNUM, 32)),
    ("openai_project_key", "sk" + "-proj-" + r(ALNUM, 48)),
    ("anthropic_api_key", "sk" + "-ant-api03-" + r(ALNUM + "-_", 93) + "AA"),
    ("hugging_face_token", "h" + "f_" + r(ALNUM, 34)),
    ("google_api_key", "AI" + "za" + r(ALNUM + "-_", 35)),
    ("google_oauth_client_secret", "GOC" + "SPX-" + r(ALNUM + "-_", 28)),
    ("rsa_private_key", _pem("RSA " + _PK)),
    (
        "pkcs8_private_key_in_service_account_json",
        json.dumps(
            {"type": "service_account", "private_key_id": r(HEX, 40), "private_key": _pem(_PK)}
        ),
    ),
    ("openssh_private_key", _pem("OPENSSH " + _PK)),
    ("ec_private_key", _pem("EC " + _PK)),
    ("pgp_private_key_block", _pem("PGP " + _PK + " BLOCK")),
    ("putty_private_key", "PuTTY-User-" + "Key-File-2: ssh-rsa\nEncryption: none\n"),
    ("jwt", _JWT),
    ("authorization_bearer_header", "Authorization: " + "Bearer " + r(ALNUM, 32)),
    (
        "authorization_basic_header",
        "Authorization: " + "Basic " + base64.b64encode(("svc:" + _PASSWORD).encode()).decode(),
    ),
    (
        "basic_credentials_alone",
        "Basic " + base64.b64encode(("ci-bot:" + _PASSWORD).encode()).decode(),
    ),
    ("https_uri_with_password", "https://svc:" + _PASSWORD + "@data.example.com/web.jsonl"),
    ("postgres_url_with_password", "postgresql://app:" + _PASSWORD + "@db.internal:5432/prod"),
    (
        "azure_storage_connection_string",
        "DefaultEndpointsProtocol=https;AccountName=acct;"
        + "Account"
        + "Key="
        + b64(64)
        + ";EndpointSuffix=core.windows.net",
    ),
    (
        "azure_sas_url",
        "https://acct.blob.core.windows.net/data/web.jsonl?sv=2022-11-02&ss=b"
        "&srt=o&sp=r&se=2026-12-31T00:00:00Z&spr=https&s" + "ig=" + quote(b64(32), safe=""),
    ),
    (
        "aws_presigned_url",
        "https://bucket.s3.us-east-1.amazonaws.com/web.jsonl"
        "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Date=20261203T000000Z&X-Amz-Expires=3600"
        "&X-Amz-SignedHeaders=host&X-Amz-" + "Signature=" + r(HEX, 64),
    ),
    (
        "gcs_signed_url",
        "https://storage.googleapis.com/bucket/web.jsonl"
        "?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Date=20261203T000000Z&X-Goog-Expires=900"
        "&X-Goog-SignedHeaders=host&X-Goog-" + "Signature=" + r(HEX, 512),
    ),
    ("sendgrid_key", "S" + "G." + r(ALNUM + "-_", 22) + "." + r(ALNUM + "-_", 43)),
    ("twilio_api_key", "S" + "K" + r(HEX, 32)),
    ("npm_token", "np" + "m_" + r(ALNUM, 36)),
    (
        "npmrc_auth_line",
        "//registry.npmjs.org/:_auth"
        + "Token="
        + r(HEX, 8)
        + "-"
        + r(HEX, 4)
        + "-"
        + r(HEX, 4)
        + "-"
        + r(HEX, 4)
        + "-"
        + r(HEX, 12),
    ),
    ("pypi_token", "py" + "pi-AgEIcHlwaS5vcmc" + r(ALNUM + "-_", 80)),
    ("discord_bot_token", "M" + r(ALNUM, 23) + "." + r(ALNUM, 6) + "." + r(ALNUM, 27)),
    ("telegram_bot_token", r("123456789", 10) + ":AA" + r(ALNUM + "-_", 33)),
    ("mailchimp_key", r(HEX, 32) + "-us12"),
    ("square_oauth_secret", "sq0" + "csp-" + r(ALNUM + "-_", 43)),
    ("shopify_token", "shp" + "at_" + r(HEX, 32)),
    ("databricks_token", "da" + "pi" + r(HEX, 32)),
    ("digitalocean_token", "do" + "p_v1_" + r(HEX, 64)),
    ("ito_api_key", "ito_" + "live_" + r(ALNUM, 8) + "_" + r(ALNUM + "-_", 32)),
    ("hex_api_key_bare", r(HEX, 32)),
    ("base64_secret_bare", b64(32)),
    ("password_assignment", "pass" + "word=" + _PASSWORD),
    ("x_api_key_header", "X-Api-" + "Key: " + r(ALNUM, 32)),
    (
        "uri_with_token_query",
        "https://data.example.com/web.jsonl?access_" + "token=" + r(ALNUM, 40),
    ),
    # Three shapes a hostile review found passing (issue 26): a netrc line, a Supabase
    # personal token, and a W&B key (40 hex digits: a SHA-1's shape, told apart by context).
    ("netrc_password", "machine api.wandb.ai login user pass" + "word " + r(ALNUM, 16)),
    ("supabase_token", "sb" + "p_" + r(HEX, 40)),
    ("wandb_key_assignment", "WANDB_API_" + "KEY=" + r(HEX, 40)),
    ("wandb_login", "wandb " + "login " + r(HEX, 40)),
]
assert len({name for name, _ in CREDENTIALS}) == len(CREDENTIALS)

_DIGEST = hashlib.sha256(b"web").hexdigest()

BENIGN: list[tuple[str, str]] = [
    ("sha256_hex", _DIGEST),
    ("sha256_prefixed", "sha256:" + _DIGEST),
    ("sha512_hex", hashlib.sha512(b"web").hexdigest()),
    ("git_commit", hashlib.sha1(b"web").hexdigest()),  # noqa: S324 - a digest shape, not security
    ("file_uri_tmp", "file:///tmp/pytest-of-root/pytest-12/test_plan_refused0/web.jsonl"),
    ("file_uri_with_digest", f"file:///srv/data/{_DIGEST}/web.jsonl"),
    ("s3_uri", "s3://ito-datasets/arith/v3/part-00017-of-00128.jsonl"),
    ("gs_uri", "gs://ito-datasets/FineWeb-Edu/CC-MAIN-2024-10/000_00000.parquet"),
    (
        "https_uri_with_query",
        "https://huggingface.co/datasets/HuggingFaceFW/fineweb-edu/resolve/"
        f"{hashlib.sha1(b'r').hexdigest()}/sample/10BT/000_00000.parquet?download=true",  # noqa: S324
    ),
    ("https_uri_at_in_path", "https://example.com/pkg@1.0/file"),
    ("model_name", "meta-llama/Llama-3.1-8B-Instruct"),
    ("model_name_2", "Qwen/Qwen2.5-Math-1.5B-Instruct-GPTQ-Int4"),
    ("uuid", "3f2b8c1e-9d4a-4e7b-a1c2-5d6e7f809a1b"),
    ("uuid_upper", "3F2B8C1E-9D4A-4E7B-A1C2-5D6E7F809A1B"),
    ("run_id", "run_" + "k3j5m2q7w4x6z8b2c4d6f8h2"),
    ("license_ids", "cc-by-4.0"),
    ("iso_timestamp", "2026-12-03T09:44:21.123456+00:00"),
    ("prose_basic", "basic arithmetic with two-digit numbers"),
    ("prose_tokens", "the bearer of bad news reads every token"),
    ("prose_password", "choose a strong password for your account"),
    ("checkpoint_storage", "booking"),
    ("long_path_segment", "file:///data/ThisIsALongDirectoryName2024/AnotherFolderV2/x.jsonl"),
    ("dataset_slug", "allenai/tulu-3-sft-mixture-0225"),
    ("base64_word_path", "gs://bucket/Datasets/WebText2023Q4Release/shard_0001_of_4096"),
    # The path `ito runs checkpoints` lists for an export: a run id and a step directory.
    (
        "export_path",
        "/srv/storage/booking_7Hq2kT9xW4mZ8pL3/runs/run_k3j5m2q7w4x6z8b2c4d6f8h2/ckpt/"
        "exports/sft/step_00000625",
    ),
    ("prose_login_password", "log in with your login and password to see the dashboard"),
]
