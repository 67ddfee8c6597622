//! What the pods of the real node reach on the bridge address: a minimal
//! cluster DNS (A records of Services and their endpoints' hostnames, read
//! from the API) and a TCP relay to the apiserver (which serves only on
//! loopback), reached through a DNAT of the `kubernetes` Service address.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde_json::Value;

/// The cluster domain the kubelet gives the pods.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Names (lowercase, without the trailing dot, with the cluster domain) to
/// their addresses.
pub type Records = Arc<RwLock<HashMap<String, Vec<Ipv4Addr>>>>;

/// How the poller reaches the apiserver.
#[derive(Clone)]
pub struct Api {
    pub url: String,
    pub token: String,
    pub ca_pem: Vec<u8>,
}

impl Api {
    fn client(&self) -> Result<reqwest::Client, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = reqwest::Certificate::from_pem(&self.ca_pem).map_err(|e| format!("CA: {e}"))?;
        reqwest::Client::builder()
            .add_root_certificate(ca)
            .timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("API client: {e}"))
    }
}

/// Reads Services and EndpointSlices every 300 ms and rebuilds the records
/// as CoreDNS would answer them: `<svc>.<ns>.svc` → the ready endpoints
/// (the cluster IP for a Service without endpoints, as the `kubernetes`
/// one), `<hostname>.<svc>.<ns>.svc` → that endpoint's addresses.
pub async fn poll_records(api: Api, records: Records) {
    let Ok(client) = api.client() else { return };
    loop {
        if let Ok(next) = read_records(&client, &api).await
            && let Ok(mut r) = records.write()
        {
            *r = next;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

async fn get(client: &reqwest::Client, api: &Api, path: &str) -> Result<Value, String> {
    client
        .get(format!("{}{path}", api.url))
        .bearer_auth(&api.token)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json::<Value>()
        .await
        .map_err(|e| e.to_string())
}

async fn read_records(
    client: &reqwest::Client,
    api: &Api,
) -> Result<HashMap<String, Vec<Ipv4Addr>>, String> {
    let services = get(client, api, "/api/v1/services").await?;
    let slices = get(client, api, "/apis/discovery.k8s.io/v1/endpointslices").await?;
    let mut out: HashMap<String, Vec<Ipv4Addr>> = HashMap::new();
    for slice in slices["items"].as_array().into_iter().flatten() {
        let ns = slice["metadata"]["namespace"].as_str().unwrap_or_default();
        let Some(svc) = slice["metadata"]["labels"]["kubernetes.io/service-name"].as_str() else {
            continue;
        };
        let base = format!("{svc}.{ns}.svc.{CLUSTER_DOMAIN}");
        for ep in slice["endpoints"].as_array().into_iter().flatten() {
            if ep["conditions"]["ready"] == Value::Bool(false) {
                continue;
            }
            let addrs: Vec<Ipv4Addr> = ep["addresses"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str()?.parse().ok())
                .collect();
            out.entry(base.clone()).or_default().extend(&addrs);
            if let Some(host) = ep["hostname"].as_str() {
                out.entry(format!("{host}.{base}"))
                    .or_default()
                    .extend(&addrs);
            }
        }
    }
    for svc in services["items"].as_array().into_iter().flatten() {
        let ns = svc["metadata"]["namespace"].as_str().unwrap_or_default();
        let name = svc["metadata"]["name"].as_str().unwrap_or_default();
        let key = format!("{name}.{ns}.svc.{CLUSTER_DOMAIN}");
        if let Some(ip) = svc["spec"]["clusterIP"]
            .as_str()
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok())
        {
            out.entry(key).or_insert_with(|| vec![ip]);
        }
    }
    for addrs in out.values_mut() {
        addrs.sort();
        addrs.dedup();
    }
    Ok(out)
}

/// Answers DNS queries on `socket` from `records`: A records, an empty
/// answer for another type of a known name, NXDOMAIN for every other name
/// (at once, so that a resolver's search list costs nothing).
pub async fn serve(socket: tokio::net::UdpSocket, records: Records) {
    let mut buf = [0u8; 512];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        let reply = {
            let Ok(r) = records.read() else { continue };
            answer(&buf[..n], &r)
        };
        if let Some(reply) = reply {
            let _ = socket.send_to(&reply, peer).await;
        }
    }
}

/// The reply to one query, `None` for a packet that is not one.
pub fn answer(query: &[u8], records: &HashMap<String, Vec<Ipv4Addr>>) -> Option<Vec<u8>> {
    if query.len() < 12 || query[2] & 0x80 != 0 || u16::from_be_bytes([query[4], query[5]]) != 1 {
        return None;
    }
    // The one question: labels, then type and class.
    let mut pos = 12;
    let mut labels = Vec::new();
    loop {
        let len = usize::from(*query.get(pos)?);
        pos += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(pos..pos + len)?).to_ascii_lowercase());
        pos += len;
    }
    let qtype = u16::from_be_bytes([*query.get(pos)?, *query.get(pos + 1)?]);
    let question_end = pos + 4;
    query.get(..question_end)?;
    let name = labels.join(".");
    let found = records.get(&name);
    let mut out = query[..question_end].to_vec();
    // QR, opcode copied, AA, RD copied; RA; rcode.
    out[2] = 0x84 | (query[2] & 0x79);
    out[3] = if found.is_some() { 0x80 } else { 0x83 };
    let answers: &[Ipv4Addr] = match (found, qtype) {
        (Some(addrs), 1) => addrs,
        _ => &[],
    };
    out[6..8].copy_from_slice(&u16::try_from(answers.len()).ok()?.to_be_bytes());
    out[8..12].copy_from_slice(&[0, 0, 0, 0]);
    for addr in answers {
        // A pointer to the question's name, A, IN, TTL 1 s, 4 bytes.
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 1, 0, 4]);
        out.extend_from_slice(&addr.octets());
    }
    Some(out)
}

/// Relays every connection to `listener` to `target` (the apiserver).
pub async fn relay(listener: tokio::net::TcpListener, target: SocketAddr) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(name: &str, qtype: u16) -> Vec<u8> {
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for label in name.split('.') {
            q.push(u8::try_from(label.len()).unwrap_or(0));
            q.extend_from_slice(label.as_bytes());
        }
        q.push(0);
        q.extend_from_slice(&qtype.to_be_bytes());
        q.extend_from_slice(&[0, 1]);
        q
    }

    #[test]
    fn answers_known_names_and_refuses_others() {
        let mut records = HashMap::new();
        records.insert(
            "train-0.train.ns.svc.cluster.local".to_string(),
            vec![Ipv4Addr::new(198, 18, 0, 10)],
        );
        let a =
            answer(&query("Train-0.train.ns.svc.cluster.local", 1), &records).unwrap_or_default();
        assert_eq!(&a[..2], &[0x12, 0x34]);
        assert_eq!(a[3] & 0x0f, 0, "NOERROR");
        assert_eq!(u16::from_be_bytes([a[6], a[7]]), 1);
        assert_eq!(&a[a.len() - 4..], &[198, 18, 0, 10]);
        let aaaa =
            answer(&query("train-0.train.ns.svc.cluster.local", 28), &records).unwrap_or_default();
        assert_eq!((aaaa[3] & 0x0f, aaaa[7]), (0, 0), "NOERROR, no answer");
        let nx = answer(
            &query("train-0.train.ns.svc.ns.svc.cluster.local", 1),
            &records,
        )
        .unwrap_or_default();
        assert_eq!(nx[3] & 0x0f, 3, "NXDOMAIN");
        assert!(answer(&[0; 5], &records).is_none());
    }
}
