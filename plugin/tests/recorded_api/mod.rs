//! A fake kube-apiserver over plain HTTP/1.1 on loopback that answers GETs
//! from recorded responses: `GET /apis/apps/v1/namespaces/ml/statefulsets`
//! is the file `<dir>/apis/apps/v1/namespaces/ml/statefulsets.json`, the
//! query ignored; anything else is the API server's `404 NotFound` Status.
//! One thread, one request per connection (`Connection: close`): the
//! plugin is a client that reads a handful of objects. It lives with the
//! plugin's tests so they link the plugin alone, not every program of
//! `trainwire-tests`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The largest request head read.
const MAX_HEAD: u64 = 64 * 1024;

/// The running server; its thread ends with the test process.
pub struct RecordedApiServer {
    pub addr: SocketAddr,
    requests: Arc<Mutex<Vec<String>>>,
}

impl RecordedApiServer {
    /// Serves `dir` on `127.0.0.1:0`.
    pub fn start(dir: &Path) -> std::io::Result<RecordedApiServer> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = requests.clone();
        let dir = dir.to_path_buf();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &dir, &seen);
            }
        });
        Ok(RecordedApiServer { addr, requests })
    }

    /// Every request so far, `METHOD path`.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

fn answer(stream: TcpStream, dir: &Path, seen: &Mutex<Vec<String>>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?.take(MAX_HEAD));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default().to_string();
    let target = words.next().unwrap_or_default();
    let path = target.split('?').next().unwrap_or_default().to_string();
    // The rest of the head (a GET has no body).
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header.trim().is_empty() {
            break;
        }
    }
    if let Ok(mut r) = seen.lock() {
        r.push(format!("{method} {path}"));
    }
    // Only plain path segments: never a file outside `dir`.
    let relative = PathBuf::from(path.trim_start_matches('/'));
    let plain = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    let file = dir.join(format!("{}.json", relative.display()));
    let body = (method == "GET" && plain)
        .then(|| std::fs::read(&file).ok())
        .flatten();
    let (status, body) = match body {
        Some(bytes) => ("200 OK", bytes),
        None => (
            "404 Not Found",
            serde_json::to_vec(&serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "reason": "NotFound", "code": 404, "message": format!("{path} not found")
            }))
            .unwrap_or_default(),
        ),
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(&body)?;
    stream.flush()
}

/// A kubeconfig at `dir/kubeconfig` that points a client at `addr` in
/// `namespace`.
pub fn write_kubeconfig(dir: &Path, addr: SocketAddr, namespace: &str) -> std::io::Result<PathBuf> {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\nusers:\n- name: plugin\n  user:\n    token: fake\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: plugin\n    namespace: {namespace}\ncurrent-context: fake\n"
        ),
    )?;
    Ok(path)
}
