//! Cluster access as kubectl has it, and the workload a name means.

use std::path::Path;

use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::{Error, Result};

/// A client and the namespace to use: `--kubeconfig` (else `$KUBECONFIG`,
/// `~/.kube/config`, in-cluster), `--context`, `-n`.
pub async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
    namespace: Option<String>,
) -> Result<(Client, String)> {
    let options = KubeConfigOptions {
        context: context.map(str::to_string),
        ..KubeConfigOptions::default()
    };
    let config = match (kubeconfig, context) {
        (Some(path), _) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Error::Config(format!("{}: {e}", path.display())))?
        }
        (None, Some(_)) => Config::from_kubeconfig(&options)
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
        (None, None) => Config::infer()
            .await
            .map_err(|e| Error::Config(e.to_string()))?,
    };
    let namespace = namespace.unwrap_or_else(|| config.default_namespace.clone());
    let client = Client::try_from(config).map_err(|e| Error::Config(e.to_string()))?;
    Ok((client, namespace))
}

/// A StatefulSet or a Job.
#[derive(Clone, Debug)]
pub enum Workload {
    StatefulSet(Box<StatefulSet>),
    Job(Box<Job>),
}

impl Workload {
    pub fn kind(&self) -> &'static str {
        match self {
            Workload::StatefulSet(_) => "StatefulSet",
            Workload::Job(_) => "Job",
        }
    }

    pub fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        match self {
            Workload::StatefulSet(s) => &s.metadata,
            Workload::Job(j) => &j.metadata,
        }
    }

    pub fn name(&self) -> String {
        self.meta().name.clone().unwrap_or_default()
    }

    /// The object as JSON, with its `apiVersion` and `kind`.
    pub fn to_json(&self) -> serde_json::Value {
        let (api_version, value) = match self {
            Workload::StatefulSet(s) => ("apps/v1", serde_json::to_value(s)),
            Workload::Job(j) => ("batch/v1", serde_json::to_value(j)),
        };
        let mut value = value.unwrap_or_default();
        value["apiVersion"] = api_version.into();
        value["kind"] = self.kind().into();
        value
    }
}

fn api_err(what: String) -> impl FnOnce(kube::Error) -> Error {
    move |source| Error::Api { what, source }
}

/// The workload `name` means: `statefulset/NAME`, `job/NAME` (also `sts/`,
/// `statefulsets/`, `jobs/`), or a bare NAME (a StatefulSet, else a Job).
pub async fn workload(client: &Client, namespace: &str, name: &str) -> Result<Workload> {
    let (kind, bare) = match name.split_once('/') {
        Some((kind, bare)) => (Some(kind.to_ascii_lowercase()), bare),
        None => (None, name),
    };
    let (sts, job) = match kind.as_deref() {
        None => (true, true),
        Some("statefulset" | "statefulsets" | "sts" | "statefulset.apps") => (true, false),
        Some("job" | "jobs" | "job.batch") => (false, true),
        Some(_) => return Err(Error::Kind(name.to_string())),
    };
    if sts {
        let api: Api<StatefulSet> = Api::namespaced(client.clone(), namespace);
        if let Some(s) = api
            .get_opt(bare)
            .await
            .map_err(api_err(format!("reading StatefulSet {namespace}/{bare}")))?
        {
            return Ok(Workload::StatefulSet(Box::new(s)));
        }
    }
    if job {
        let api: Api<Job> = Api::namespaced(client.clone(), namespace);
        if let Some(j) = api
            .get_opt(bare)
            .await
            .map_err(api_err(format!("reading Job {namespace}/{bare}")))?
        {
            return Ok(Workload::Job(Box::new(j)));
        }
    }
    Err(Error::NotFound {
        name: bare.to_string(),
        namespace: namespace.to_string(),
    })
}

/// Every StatefulSet and Job of the namespace.
pub async fn workloads(client: &Client, namespace: &str) -> Result<Vec<Workload>> {
    let lp = ListParams::default();
    let sts = Api::<StatefulSet>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(api_err(format!("listing StatefulSets in {namespace}")))?;
    let jobs = Api::<Job>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(api_err(format!("listing Jobs in {namespace}")))?;
    Ok(sts
        .items
        .into_iter()
        .map(|s| Workload::StatefulSet(Box::new(s)))
        .chain(jobs.items.into_iter().map(|j| Workload::Job(Box::new(j))))
        .collect())
}

/// Every pod of the namespace.
pub async fn pods(client: &Client, namespace: &str) -> Result<Vec<Pod>> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(api_err(format!("listing pods in {namespace}")))
}
