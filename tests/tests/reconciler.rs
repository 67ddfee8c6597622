//! The headless-Service reconciler against a mock API server (kube-rs's
//! `tower-test` pattern): every request it makes is checked (method, path,
//! query, body) and answered as a kube-apiserver would, and a test fails if
//! it makes one more than expected.
//!
//! The workloads are the Job and StatefulSet a real kube-apiserver sent in
//! `../shared/fixtures/admission/`, injected by the real engine (so the
//! reconciler reads what the engine writes: the status annotation, the
//! rendezvous env, the sidecar) and given a UID, as stored.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use http::{Method, StatusCode};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::Action;
use serde_json::{Value, json};
use trainwire_controllers::Error;
use trainwire_controllers::metrics::Metrics;
use trainwire_controllers::reconcile::Shared;
use trainwire_controllers::reconciler::{self, Context};
use trainwire_engine::service;
use trainwire_tests::mock_api::{self, ApiServer, BOUND, Call};
use {trainwire_engine::policy::Policy, trainwire_policyfile::SharedPolicy};

/// The reconcile's result, once it has finished.
async fn outcome<T>(
    task: tokio::task::JoinHandle<trainwire_controllers::Result<T>>,
) -> Result<trainwire_controllers::Result<T>> {
    Ok(tokio::time::timeout(BOUND, task)
        .await
        .context("the reconciler did not finish: it made a request the test did not expect")??)
}

const NS: &str = "trainwire-test";
const JOB_UID: &str = "6a1f0f3e-0d3b-4a36-9d6a-1b3c51d8a001";
const STS_UID: &str = "6a1f0f3e-0d3b-4a36-9d6a-1b3c51d8a002";

fn mock() -> (Arc<Context>, ApiServer) {
    let (client, server) = mock_api::pair();
    (
        Arc::new(Context::new(Shared::new(
            client,
            SharedPolicy::new(Policy::default()),
            Arc::new(Metrics::new()),
            Box::new(Timestamp::now),
        ))),
        server,
    )
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

fn fixture_object(name: &str) -> Result<Value> {
    Ok(trainwire_tests::fixtures::request_object(name).0)
}

/// The fixture object injected by the real engine, as the apiserver
/// stores it after admission (plus a UID).
fn injected(fixture: &str, uid: &str) -> Result<Value> {
    injected_with(fixture, uid, |_| {})
}

/// The same, with the manifest edited before injection.
fn injected_with(fixture: &str, uid: &str, edit: impl FnOnce(&mut Value)) -> Result<Value> {
    let mut object = fixture_object(fixture)?;
    edit(&mut object);
    let profile = trainwire_engine::policy::Profile::default();
    match trainwire_engine::mutation::mutate(&object, Some(NS), &profile) {
        Ok(trainwire_engine::mutation::Outcome::Mutated(m)) => {
            let mut o = m.object;
            o["metadata"]["uid"] = json!(uid);
            Ok(o)
        }
        Ok(_) => bail!("{fixture}: the engine does not manage it"),
        Err(refusal) => bail!("{fixture}: refused: {refusal}"),
    }
}

/// Give the trainer of a manifest its own PET_RDZV_ENDPOINT (which wins
/// over the engine's).
fn with_endpoint(o: &mut Value, endpoint: &str) {
    let trainer = &mut o["spec"]["template"]["spec"]["containers"][0];
    let mut env = trainer["env"].as_array().cloned().unwrap_or_default();
    env.push(json!({"name": "PET_RDZV_ENDPOINT", "value": endpoint}));
    trainer["env"] = Value::Array(env);
}

/// The fixture Job `bert-pretrain`, stored (UID) and injected.
fn job() -> Result<Job> {
    Ok(serde_json::from_value(injected(
        "job-indexed-create.json",
        JOB_UID,
    )?)?)
}

/// The fixture StatefulSet `llama-ft`, stored and injected, its manifest
/// setting its own rendezvous endpoint on port 29400 (the user's env wins
/// over the engine's, and the engine records the port the trainer uses).
fn statefulset() -> Result<StatefulSet> {
    let o = injected_with("statefulset-create.json", STS_UID, |o| {
        with_endpoint(o, "llama-ft-0.llama-ft.trainwire-test.svc:29400");
    })?;
    Ok(serde_json::from_value(o)?)
}

/// A Service as the apiserver stores what the reconciler sent: defaults
/// filled in (type, clusterIPs, ipFamilies, sessionAffinity).
fn stored(sent: &Value) -> Value {
    let mut s = sent.clone();
    s["metadata"]["uid"] = json!("svc-uid");
    s["metadata"]["resourceVersion"] = json!("42");
    s["spec"]["type"] = json!("ClusterIP");
    s["spec"]["clusterIPs"] = json!(["None"]);
    s["spec"]["ipFamilies"] = json!(["IPv4"]);
    s["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    s["spec"]["sessionAffinity"] = json!("None");
    s["status"] = json!({"loadBalancer": {}});
    s
}

fn desired_job_service() -> Result<Value> {
    let w = service::Workload::from_job(&job()?)?.context("the Job is injected")?;
    Ok(serde_json::to_value(w.desired_service())?)
}

fn event_of(call: &Call) -> (String, String, String, String) {
    let b = &call.body;
    (
        b["type"].as_str().unwrap_or_default().to_string(),
        b["reason"].as_str().unwrap_or_default().to_string(),
        b["regarding"]["kind"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        b["regarding"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

/// The next request is an Event of `(type, reason, kind, name)`: checked
/// and answered as created.
async fn expect_event(server: &mut ApiServer, want: (&str, &str, &str, &str)) -> Result<()> {
    let event = server.expect(Method::POST, EVENTS).await?;
    let got = event_of(&event);
    assert_eq!(
        (
            got.0.as_str(),
            got.1.as_str(),
            got.2.as_str(),
            got.3.as_str()
        ),
        want
    );
    let echoed = event.body.clone();
    event.reply(StatusCode::CREATED, &echoed);
    Ok(())
}

const SERVICES: &str = "/api/v1/namespaces/trainwire-test/services";
const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/trainwire-test/events";

#[tokio::test]
async fn an_injected_job_gets_its_headless_service_owned_by_the_job() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));

    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(
            StatusCode::NOT_FOUND,
            &status(404, "NotFound", "services \"bert-pretrain\" not found"),
        );

    let create = server.expect(Method::POST, SERVICES).await?;
    assert!(
        create.query.contains("fieldManager=trainwire"),
        "{}",
        create.query
    );
    let sent = create.body.clone();
    assert_eq!(
        sent["metadata"]["name"], "bert-pretrain",
        "named after spec.template.spec.subdomain"
    );
    assert_eq!(sent["metadata"]["namespace"], NS);
    assert_eq!(
        sent["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "trainwire"
    );
    assert_eq!(
        sent["metadata"]["annotations"]["trainwire.dev/service-for"],
        "Job/bert-pretrain"
    );
    // Garbage collection deletes it with the Job: one controller owner
    // reference with the Job's UID, and no blockOwnerDeletion (which would
    // need update on jobs/finalizers).
    assert_eq!(
        sent["metadata"]["ownerReferences"],
        json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "bert-pretrain",
                "uid": JOB_UID, "controller": true}])
    );
    assert_eq!(sent["spec"]["clusterIP"], "None");
    assert_eq!(sent["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(
        sent["spec"]["selector"],
        json!({"batch.kubernetes.io/job-name": "bert-pretrain"})
    );
    assert_eq!(
        sent["spec"]["ports"],
        json!([
            {"name": "rdzv", "port": 29500, "targetPort": 29500, "protocol": "TCP"},
            {"name": "trainwire", "port": 29600, "targetPort": 29600, "protocol": "TCP"},
        ])
    );
    create.reply(StatusCode::CREATED, &stored(&sent));

    expect_event(
        &mut server,
        ("Normal", "ServiceCreated", "Job", "bert-pretrain"),
    )
    .await?;

    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

#[tokio::test]
async fn a_service_already_in_place_is_not_written() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &stored(&desired_job_service()?));
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

#[tokio::test]
async fn a_foreign_service_in_the_way_is_left_alone_and_reported_once() -> Result<()> {
    let (ctx, mut server) = mock();
    // Someone's ClusterIP Service of the same name, selecting other pods.
    let foreign = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bert-pretrain", "namespace": NS, "uid": "foreign-uid", "resourceVersion": "7"},
        "spec": {"clusterIP": "10.96.0.12", "selector": {"app": "dashboard"},
                 "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}]},
    });

    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx.clone()));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &foreign);
    let event = server.expect(Method::POST, EVENTS).await?;
    assert_eq!(
        event_of(&event),
        (
            "Warning".into(),
            "ServiceConflict".into(),
            "Job".into(),
            "bert-pretrain".into()
        )
    );
    let note = event.body["note"].as_str().unwrap_or_default().to_string();
    assert!(note.contains("not created by trainwire"), "{note}");
    assert!(note.contains("not headless"), "{note}");
    assert!(note.contains("does not select"), "{note}");
    let echoed = event.body.clone();
    event.reply(StatusCode::CREATED, &echoed);
    // Looked at again later, in case the user deletes it.
    assert_eq!(
        outcome(task).await??,
        Action::requeue(Duration::from_secs(60))
    );

    // The next pass reads it again, writes nothing, reports nothing new.
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &foreign);
    assert_eq!(
        outcome(task).await??,
        Action::requeue(Duration::from_secs(60))
    );
    server.done().await
}

#[tokio::test]
async fn a_users_own_usable_service_for_a_job_is_left_alone_with_a_normal_event() -> Result<()> {
    let (ctx, mut server) = mock();
    let users = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "bert-pretrain", "namespace": NS, "uid": "user-uid"},
        "spec": {"clusterIP": "None", "selector": {"app": "bert-pretrain"}},
    });
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &users);
    expect_event(
        &mut server,
        ("Normal", "ServiceNotManaged", "Job", "bert-pretrain"),
    )
    .await?;
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

#[tokio::test]
async fn a_deleted_job_needs_nothing_garbage_collection_removes_the_service() -> Result<()> {
    let (ctx, server) = mock();
    let mut deleting = job()?;
    deleting.metadata.deletion_timestamp = serde_json::from_value(json!("2026-11-21T18:00:00Z"))?;
    let action = reconciler::reconcile_job(Arc::new(deleting), ctx.clone()).await?;
    assert_eq!(action, Action::await_change());
    drop(ctx);
    server.done().await
}

#[tokio::test]
async fn a_finished_or_not_injected_job_is_not_touched() -> Result<()> {
    let (ctx, server) = mock();
    let mut finished = job()?;
    finished.status = serde_json::from_value(json!({
        "conditions": [{"type": "Complete", "status": "True"}], "succeeded": 2}))?;
    assert_eq!(
        reconciler::reconcile_job(Arc::new(finished), ctx.clone()).await?,
        Action::await_change()
    );
    // Annotated but never injected (say, created before the webhook ran).
    let mut plain: Job = serde_json::from_value(fixture_object("job-indexed-create.json")?)?;
    plain.metadata.uid = Some(JOB_UID.to_string());
    assert_eq!(
        reconciler::reconcile_job(Arc::new(plain), ctx.clone()).await?,
        Action::await_change()
    );
    drop(ctx);
    server.done().await
}

#[tokio::test]
async fn its_own_service_changed_by_hand_is_brought_back_with_server_side_apply() -> Result<()> {
    let (ctx, mut server) = mock();
    let mut drifted = stored(&desired_job_service()?);
    drifted["spec"]["publishNotReadyAddresses"] = json!(false);
    drifted["spec"]["selector"] = json!({"app": "something-else"});
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &drifted);
    let patch = server
        .expect(Method::PATCH, &format!("{SERVICES}/bert-pretrain"))
        .await?;
    assert_eq!(patch.content_type, "application/apply-patch+yaml");
    assert!(
        patch.query.contains("fieldManager=trainwire"),
        "{}",
        patch.query
    );
    assert!(patch.query.contains("force=true"), "{}", patch.query);
    assert_eq!(
        patch.body["spec"]["selector"],
        json!({"batch.kubernetes.io/job-name": "bert-pretrain"})
    );
    assert_eq!(patch.body["spec"]["publishNotReadyAddresses"], true);
    let applied = stored(&patch.body);
    patch.reply(StatusCode::OK, &applied);
    let event = server.expect(Method::POST, EVENTS).await?;
    assert_eq!(event_of(&event).1, "ServiceUpdated");
    let echoed = event.body.clone();
    event.reply(StatusCode::CREATED, &echoed);
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

#[tokio::test]
async fn losing_the_creation_race_to_another_replica_is_not_an_error() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::NOT_FOUND, &status(404, "NotFound", "not found"));
    server.expect(Method::POST, SERVICES).await?.reply(
        StatusCode::CONFLICT,
        &status(
            409,
            "AlreadyExists",
            "services \"bert-pretrain\" already exists",
        ),
    );
    assert_eq!(
        outcome(task).await??,
        Action::requeue(Duration::from_secs(1))
    );
    server.done().await
}

#[tokio::test]
async fn the_service_of_an_earlier_job_of_the_same_name_is_waited_out() -> Result<()> {
    let (ctx, mut server) = mock();
    let mut earlier = stored(&desired_job_service()?);
    earlier["metadata"]["ownerReferences"][0]["uid"] = json!("uid-of-the-deleted-job");
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(StatusCode::OK, &earlier);
    assert_eq!(
        outcome(task).await??,
        Action::requeue(Duration::from_secs(5))
    );
    server.done().await
}

#[tokio::test]
async fn forbidden_says_which_clusterrole_to_check() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job()?), ctx));
    server
        .expect(Method::GET, &format!("{SERVICES}/bert-pretrain"))
        .await?
        .reply(
            StatusCode::FORBIDDEN,
            &status(403, "Forbidden", "services \"bert-pretrain\" is forbidden: User \"system:serviceaccount:trainwire-system:trainwire-controllers\" cannot get resource \"services\""),
        );
    let err = outcome(task).await?.expect_err("a 403 is an error");
    assert!(matches!(err, Error::Api { .. }));
    let text = err.to_string();
    assert!(
        text.contains(
            "reading Service trainwire-test/bert-pretrain for Job trainwire-test/bert-pretrain"
        ),
        "{text}"
    );
    assert!(text.contains("ClusterRole trainwire-controllers"), "{text}");
    server.done().await
}

#[tokio::test]
async fn a_statefulset_whose_service_is_missing_gets_one_owned_by_it() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_statefulset(
        Arc::new(statefulset()?),
        ctx,
    ));
    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft"))
        .await?
        .reply(StatusCode::NOT_FOUND, &status(404, "NotFound", "not found"));
    let create = server.expect(Method::POST, SERVICES).await?;
    let sent = create.body.clone();
    assert_eq!(sent["metadata"]["name"], "llama-ft", "spec.serviceName");
    assert_eq!(
        sent["metadata"]["ownerReferences"],
        json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llama-ft",
                "uid": STS_UID, "controller": true}])
    );
    assert_eq!(
        sent["spec"]["selector"],
        json!({"app": "llama-ft"}),
        "the StatefulSet's matchLabels"
    );
    assert_eq!(sent["spec"]["clusterIP"], "None");
    assert_eq!(sent["spec"]["publishNotReadyAddresses"], true);
    // The rendezvous port is the one injected into PET_RDZV_ENDPOINT.
    assert_eq!(sent["spec"]["ports"][0]["port"], 29400);
    create.reply(StatusCode::CREATED, &stored(&sent));
    expect_event(
        &mut server,
        ("Normal", "ServiceCreated", "StatefulSet", "llama-ft"),
    )
    .await?;
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

#[tokio::test]
async fn a_statefulsets_own_service_is_the_users_and_is_not_reported() -> Result<()> {
    let (ctx, mut server) = mock();
    let users = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama-ft", "namespace": NS, "uid": "user-uid",
                     "labels": {"app": "llama-ft"}},
        "spec": {"clusterIP": "None", "selector": {"app": "llama-ft"},
                 "ports": [{"name": "rdzv", "port": 29500}]},
    });
    let task = tokio::spawn(reconciler::reconcile_statefulset(
        Arc::new(statefulset()?),
        ctx,
    ));
    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft"))
        .await?
        .reply(StatusCode::OK, &users);
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

/// The rendezvous port of the Service is the one the trainer uses, as the
/// engine recorded it in the typed status: the manifest's own endpoint, the
/// c10d default when that names no port, the annotation, else 29500.
#[test]
fn the_rendezvous_port_is_the_one_the_trainer_uses() -> Result<()> {
    let rdzv = |edit: &dyn Fn(&mut Value)| -> Result<i32> {
        let job: Job =
            serde_json::from_value(injected_with("job-indexed-create.json", JOB_UID, edit)?)?;
        let w = service::Workload::from_job(&job)?.context("injected")?;
        w.ports
            .iter()
            .find(|p| p.name.as_deref() == Some("rdzv"))
            .map(|p| p.port)
            .context("no rdzv port")
    };
    assert_eq!(rdzv(&|_| {})?, 29500);
    assert_eq!(
        rdzv(&|o| with_endpoint(o, "bert-pretrain-0.bert-pretrain.trainwire-test.svc:29400"))?,
        29400
    );
    assert_eq!(
        rdzv(&|o| with_endpoint(o, "[fd00::1]"))?,
        29400,
        "c10d's own default"
    );
    assert_eq!(
        rdzv(&|o| {
            o["metadata"]["annotations"]["trainwire.dev/rdzv-port"] = json!("29777");
        })?,
        29777
    );
    Ok(())
}

#[test]
fn a_stored_service_it_created_plans_as_up_to_date() -> Result<()> {
    let sts = statefulset()?;
    let w = service::Workload::from_statefulset(&sts)?.context("injected")?;
    let service: Service =
        serde_json::from_value(stored(&serde_json::to_value(w.desired_service())?))?;
    assert_eq!(service::plan(&w, Some(&service)), service::Plan::UpToDate);
    assert!(matches!(service::plan(&w, None), service::Plan::Create(_)));
    Ok(())
}

/// Every injected Job among the rendered examples gets a Service from the
/// reconciler, named after the subdomain the engine set.
#[test]
fn every_rendered_example_job_gets_its_service() -> Result<()> {
    let dir = trainwire_tests::repo_root().join("examples/rendered");
    let mut jobs = 0;
    for entry in std::fs::read_dir(&dir)? {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path)?;
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text)?;
        for mut doc in docs.into_iter().filter(|d| d["kind"] == "Job") {
            doc["metadata"]["uid"] = json!("uid");
            let job: Job = serde_json::from_value(doc)?;
            let w = service::Workload::from_job(&job)?
                .with_context(|| format!("{}: injected Job without a Service", path.display()))?;
            let subdomain = job
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|s| s.subdomain.clone());
            assert_eq!(Some(w.service.clone()), subdomain);
            assert_eq!(
                w.selector.get("batch.kubernetes.io/job-name"),
                job.metadata.name.as_ref()
            );
            assert!(w.ports.iter().any(|p| p.name.as_deref() == Some("rdzv")));
            jobs += 1;
        }
    }
    assert!(jobs >= 2, "rendered Jobs found: {jobs}");
    Ok(())
}

const DEPLOYMENTS: &str = "/apis/apps/v1/namespaces/trainwire-test/deployments";

/// The fixture StatefulSet with a hot spare and a dedicated store (3 pods).
fn statefulset_with_store() -> Result<StatefulSet> {
    let o = injected_with("statefulset-create.json", STS_UID, |o| {
        o["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("dedicated");
        o["metadata"]["annotations"]["trainwire.dev/spares"] = json!("1");
        o["spec"]["replicas"] = json!(3);
    })?;
    Ok(serde_json::from_value(o)?)
}

/// A StatefulSet whose own headless Service exists and whose store does
/// not: the store's Deployment and Service are created, owned by it.
#[tokio::test]
async fn a_dedicated_store_is_created_owned_by_its_workload() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_statefulset(
        Arc::new(statefulset_with_store()?),
        ctx,
    ));
    let users = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama-ft", "namespace": NS, "uid": "user-uid"},
        "spec": {"clusterIP": "None", "selector": {"app": "llama-ft"}}});
    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft"))
        .await?
        .reply(StatusCode::OK, &users);
    let owner = json!([{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "llama-ft",
                        "uid": STS_UID, "controller": true}]);

    server
        .expect(Method::GET, &format!("{DEPLOYMENTS}/llama-ft-rdzv"))
        .await?
        .reply(StatusCode::NOT_FOUND, &status(404, "NotFound", "not found"));
    let create = server.expect(Method::POST, DEPLOYMENTS).await?;
    let sent = create.body.clone();
    assert_eq!(sent["metadata"]["name"], "llama-ft-rdzv");
    assert_eq!(sent["metadata"]["ownerReferences"], owner);
    assert_eq!(sent["spec"]["replicas"], 1);
    let pod = &sent["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["image"], "registry.example.invalid/llama-ft:1.0",
        "the trainer's image: its torch speaks the trainer's store protocol"
    );
    assert_eq!(pod["containers"][0]["ports"][0]["containerPort"], 29500);
    assert_eq!(pod["automountServiceAccountToken"], false);
    create.reply(StatusCode::CREATED, &sent);

    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft-rdzv"))
        .await?
        .reply(StatusCode::NOT_FOUND, &status(404, "NotFound", "not found"));
    let create = server.expect(Method::POST, SERVICES).await?;
    let sent = create.body.clone();
    assert_eq!(sent["metadata"]["ownerReferences"], owner);
    assert_eq!(
        sent["spec"]["selector"],
        json!({"trainwire.dev/rdzv-store": "llama-ft"})
    );
    create.reply(StatusCode::CREATED, &stored(&sent));

    expect_event(
        &mut server,
        ("Normal", "StoreCreated", "StatefulSet", "llama-ft"),
    )
    .await?;
    assert_eq!(outcome(task).await??, Action::await_change());
    server.done().await
}

/// A Deployment of the store's name that is not this workload's is left
/// alone, reported with a Warning, and looked at again later.
#[tokio::test]
async fn a_foreign_object_in_the_stores_place_is_reported_not_touched() -> Result<()> {
    let (ctx, mut server) = mock();
    let task = tokio::spawn(reconciler::reconcile_statefulset(
        Arc::new(statefulset_with_store()?),
        ctx,
    ));
    let users = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama-ft", "namespace": NS, "uid": "user-uid"},
        "spec": {"clusterIP": "None", "selector": {"app": "llama-ft"}}});
    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft"))
        .await?
        .reply(StatusCode::OK, &users);
    let foreign = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llama-ft-rdzv", "namespace": NS, "uid": "other"},
        "spec": {"selector": {"matchLabels": {"app": "x"}},
                 "template": {"metadata": {"labels": {"app": "x"}},
                              "spec": {"containers": [{"name": "x", "image": "x"}]}}}});
    server
        .expect(Method::GET, &format!("{DEPLOYMENTS}/llama-ft-rdzv"))
        .await?
        .reply(StatusCode::OK, &foreign);
    expect_event(
        &mut server,
        ("Warning", "StoreConflict", "StatefulSet", "llama-ft"),
    )
    .await?;
    let existing = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "llama-ft-rdzv", "namespace": NS, "uid": "s",
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet",
                        "name": "llama-ft", "uid": STS_UID, "controller": true}]},
        "spec": {"selector": {"trainwire.dev/rdzv-store": "llama-ft"}}});
    server
        .expect(Method::GET, &format!("{SERVICES}/llama-ft-rdzv"))
        .await?
        .reply(StatusCode::OK, &existing);
    let apply = server
        .expect(Method::PATCH, &format!("{SERVICES}/llama-ft-rdzv"))
        .await?;
    assert!(
        apply.query.contains("fieldManager=trainwire"),
        "{}",
        apply.query
    );
    assert!(apply.query.contains("force=true"), "{}", apply.query);
    apply.reply(StatusCode::OK, &existing);
    assert!(matches!(outcome(task).await??, a if a != Action::await_change()));
    server.done().await
}

/// A finished Job's store runs for nothing: its Deployment is deleted.
#[tokio::test]
async fn a_finished_jobs_store_is_deleted() -> Result<()> {
    let (ctx, mut server) = mock();
    let mut o = injected_with("job-indexed-create.json", JOB_UID, |o| {
        o["metadata"]["annotations"]["trainwire.dev/rdzv-store"] = json!("dedicated");
    })?;
    o["status"] = json!({"conditions": [{"type": "Complete", "status": "True"}]});
    let job: Job = serde_json::from_value(o)?;
    let task = tokio::spawn(reconciler::reconcile_job(Arc::new(job), ctx));
    // (A finished Job's headless Service is not looked at: nothing joins.)
    let mine = json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "bert-pretrain-rdzv", "namespace": NS, "uid": "d",
                     "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job",
                        "name": "bert-pretrain", "uid": JOB_UID, "controller": true}]}});
    server
        .expect(Method::GET, &format!("{DEPLOYMENTS}/bert-pretrain-rdzv"))
        .await?
        .reply(StatusCode::OK, &mine);
    server
        .expect(Method::DELETE, &format!("{DEPLOYMENTS}/bert-pretrain-rdzv"))
        .await?
        .reply(StatusCode::OK, &mine);
    outcome(task).await??;
    server.done().await
}
