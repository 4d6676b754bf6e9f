//! `rlx serve` as a user starts it: a free port, a request, Ctrl-C-free stop.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStderr, Stdio};

use common::{rlx, tiny};

fn post(addr: &str, path: &str, body: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// `rlx serve` on the tiny model with `extra` flags, on a free port, once
/// `/health` says the model is in: the process, its address and its stderr.
fn start(extra: &[&str]) -> (Child, String, BufReader<ChildStderr>) {
    let mut child = rlx()
        .args(["serve", "-m"])
        .arg(tiny())
        .args(["--port", "0", "-t", "1", "-c", "128"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_owned();
    // The port answers at once; /health says 200 once the model is in.
    let mut ready = false;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let mut s = TcpStream::connect(&addr).unwrap();
        write!(
            s,
            "GET /health HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        if out.starts_with("HTTP/1.1 200") {
            ready = true;
            break;
        }
        assert!(out.starts_with("HTTP/1.1 503"), "{out}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ready, "the server never became ready");
    (child, addr, stderr)
}

/// A 200 reply's JSON body.
fn body(reply: &str) -> serde_json::Value {
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    serde_json::from_str(&reply[reply.find("\r\n\r\n").unwrap() + 4..]).unwrap()
}

#[test]
fn serve_answers_chat_completions_on_the_port_it_prints() {
    let (mut child, addr, mut stderr) = start(&[]);
    let mut line = String::new();
    let reply = post(
        &addr,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}"#,
    );
    let v = body(&reply);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "model-f32");
    // The request is logged on stderr (after the line saying it is ready).
    line.clear();
    while !line.starts_with("id=") {
        line.clear();
        let n = stderr.read_line(&mut line).unwrap();
        assert!(n > 0, "stderr ended before the request's line");
    }
    assert!(line.starts_with("id=chatcmpl-"), "{line}");
    for key in [
        "endpoint=/v1/chat/completions",
        "status=200",
        "completion_tokens=4",
        "finish=length",
    ] {
        assert!(line.contains(key), "{key} in {line}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `--chat-template FILE` replaces the file's own template for every chat
/// route: a template that ignores the conversation makes every prompt the
/// same tokens, and Ollama's `/api/show` gives its source.
#[test]
fn serve_renders_chats_with_the_given_template() {
    let fixed = "The capital of France is";
    let template = std::env::temp_dir().join(format!("rlx-serve-template-{}", std::process::id()));
    let source = format!("{{{{ bos_token }}}}{fixed}");
    std::fs::write(&template, &source).unwrap();
    let tokens = common::ok(
        rlx()
            .args(["tokenize", "--ids", "--text", fixed, "-m"])
            .arg(tiny()),
    );
    let want = String::from_utf8(tokens.stdout)
        .unwrap()
        .trim()
        .split(',')
        .count();
    let (mut child, addr, _stderr) = start(&["--chat-template", template.to_str().unwrap()]);
    for content in ["Hello", "A much longer message than the other one"] {
        let request = serde_json::json!({
            "messages": [{"role": "user", "content": content}],
            "max_tokens": 1,
        });
        let v = body(&post(&addr, "/v1/chat/completions", &request.to_string()));
        assert_eq!(v["usage"]["prompt_tokens"], want, "{v}");
    }
    let shown = body(&post(&addr, "/api/show", r#"{"model": "model-f32"}"#));
    assert_eq!(shown["template"], source.as_str());
    child.kill().unwrap();
    child.wait().unwrap();
    let _ = std::fs::remove_file(template);
}
