"""The deployment kit's proxy and storage credentials (compose.yaml, deploy/; issue 40 M2 and
M5). No container runs here (docs/deploy.md): the proxy's configuration is checked by
Debian's nginx itself (`nginx -t`, with a throwaway certificate), and compose.yaml by
docker-compose's own `config` where it is installed; the rest is read from the files."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "nginx" / "anex.conf.template"
POLICY = ROOT / "deploy" / "minio" / "anex-app-policy.json"


def compose() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "compose.yaml").read_text()))


def anex_services() -> dict[str, Any]:
    return {name: service for name, service in compose()["services"].items()
            if str(service.get("image", "")).startswith("anex")}


def nginx() -> str | None:
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin")


def test_the_app_never_holds_minios_root_login() -> None:
    services = compose()["services"]
    for name, service in anex_services().items():
        environment = service["environment"]
        assert "MINIO_ROOT" not in str(environment["AWS_ACCESS_KEY_ID"]), name
        assert "MINIO_ROOT" not in str(environment["AWS_SECRET_ACCESS_KEY"]), name
        # .env reaches every service (env_file): the root login is blanked over it
        assert environment["MINIO_ROOT_USER"] == environment["MINIO_ROOT_PASSWORD"] == "", name
        assert environment["ANEX_S3_PUBLIC_ENDPOINT_URL"].startswith("https://"), name
        assert environment["ANEX_TRUSTED_PROXY_COUNT"] == "1", name
        if name != "migrate":
            assert service["depends_on"]["minio-init"] == {
                "condition": "service_completed_successfully"}, name
    # the app's own user is made by minio-init, which refuses the example's passwords
    init = services["minio-init"]
    script = init["command"][0]
    assert "mc admin user add local \"$$ANEX_S3_ACCESS_KEY\"" in script
    assert "*CHANGEME*" in script and "-lt 16" in script
    assert "./deploy/minio/anex-app-policy.json:/policy/anex-app-policy.json:ro" in init["volumes"]


def test_the_apps_storage_user_reaches_the_anex_buckets_only() -> None:
    policy = json.loads(POLICY.read_text())
    resources = {resource for statement in policy["Statement"]
                 for resource in statement["Resource"]}
    assert resources == {"arn:aws:s3:::anex-world", "arn:aws:s3:::anex-eu",
                         "arn:aws:s3:::anex-world/*", "arn:aws:s3:::anex-eu/*"}
    actions = {action for statement in policy["Statement"] for action in statement["Action"]}
    assert all(action.startswith("s3:") and "*" not in action for action in actions)
    assert not {"s3:DeleteBucket", "s3:PutBucketPolicy", "s3:CreateBucket"} & actions


def test_customers_reach_the_web_role_only_through_the_proxy() -> None:
    services = compose()["services"]
    assert "ports" not in services["web"]
    proxy = services["proxy"]
    assert {"80:80", "443:443"} <= set(proxy["ports"])
    assert "./deploy/nginx/anex.conf.template:/etc/nginx/templates/default.conf.template:ro" \
        in proxy["volumes"]
    # every other service is published on loopback at most
    for name, service in services.items():
        if name != "proxy":
            assert all(str(port).startswith("127.0.0.1:") for port in service.get("ports", [])), \
                name


def rendered(tmp_path: Path) -> Path:
    """The template as nginx's image renders it (envsubst of ANEX_STORAGE_HOST only), its
    certificate paths pointed at a throwaway certificate, under a minimal nginx.conf."""
    ca = trustme.CA()
    certificate = ca.issue_cert("api.example.test", "api-eu.example.test",
                                "storage.example.test")
    tls = tmp_path / "tls"
    tls.mkdir()
    certificate.private_key_pem.write_to_path(str(tls / "privkey.pem"))
    (tls / "fullchain.pem").write_bytes(b"".join(blob.bytes() for blob in
                                                 certificate.cert_chain_pems))
    text = TEMPLATE.read_text()
    assert set(re.findall(r"\$\{(\w+)\}", text)) == {"ANEX_STORAGE_HOST"}
    text = text.replace("${ANEX_STORAGE_HOST}", "storage.example.test")
    text = text.replace("/etc/nginx/tls/", f"{tls}/")
    (tmp_path / "anex.conf").write_text(text)
    for temporary in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (tmp_path / temporary).mkdir()
    main = tmp_path / "nginx.conf"
    main.write_text(f"""
pid {tmp_path}/nginx.pid;
error_log {tmp_path}/error.log;
events {{}}
http {{
    client_body_temp_path {tmp_path}/client_body;
    proxy_temp_path {tmp_path}/proxy;
    fastcgi_temp_path {tmp_path}/fastcgi;
    uwsgi_temp_path {tmp_path}/uwsgi;
    scgi_temp_path {tmp_path}/scgi;
    access_log off;
    include {tmp_path}/anex.conf;
}}
""")
    return main


@pytest.mark.skipif(nginx() is None, reason="nginx is not installed (Debian: apt-get install "
                                            "nginx-light; .ci/run installs it)")
def test_nginx_accepts_the_proxys_configuration(tmp_path: Path) -> None:
    main = rendered(tmp_path)
    result = subprocess.run([str(nginx()), "-t", "-p", str(tmp_path), "-c", str(main),
                             "-e", str(tmp_path / "error.log")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "test is successful" in result.stderr


def test_the_proxy_buffers_slow_clients_and_bounds_them() -> None:
    text = TEMPLATE.read_text()
    app = text.split("server_name _;")[2].split("server {")[0]  # the web role's server
    for directive in ("client_header_timeout 10s;", "client_body_timeout 30s;",
                      "send_timeout 30s;", "proxy_request_buffering on;",
                      "proxy_buffering on;", "ssl_protocols TLSv1.2 TLSv1.3;",
                      "proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;"):
        assert directive in app, directive
    assert "return 301 https://$host$request_uri;" in text


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose is not installed (Debian: apt-get install "
                           "docker-compose); compose.yaml is then only read as YAML here")
def test_compose_accepts_the_files_with_the_example_environment(tmp_path: Path) -> None:
    for name in ("compose.yaml", "compose.gpu.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / ".env.example", tmp_path / ".env")
    result = subprocess.run([str(shutil.which("docker-compose")), "-f", "compose.yaml", "-f",
                             "compose.gpu.yaml", "config", "-q"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
