//! Images: present locally, loaded from a tarball in the task dir, or pulled — one pull per
//! reference however many tasks ask at once — and reference-counted so `gc.image` removes an
//! image `image_delay` after its last task is gone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{CreateImageOptions, ImportImageOptions, RemoveImageOptions};
use futures::StreamExt;
use futures::future::{BoxFuture, FutureExt, Shared};

use super::super::DriverError;
use super::container::status_of;

type PullResult = Result<(), String>;

/// Image references held by tasks, and pulls in flight.
pub struct Images {
    pulls: Mutex<HashMap<String, Shared<BoxFuture<'static, PullResult>>>>,
    /// Image ID → users, and a generation that cancels a pending delayed removal.
    refs: Mutex<HashMap<String, (usize, u64)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The event text for an image that is neither here nor pullable.
pub fn not_found_message(image: &str, reason: &str) -> String {
    format!("Failed to pull `{image}`: image not found locally and no registry reachable ({reason})")
}

impl Images {
    pub fn new() -> Arc<Images> {
        Arc::new(Images { pulls: Mutex::new(HashMap::new()), refs: Mutex::new(HashMap::new()) })
    }

    /// The image's ID when the Engine has it.
    pub async fn local_id(docker: &Docker, image: &str) -> Result<Option<String>, DriverError> {
        match docker.inspect_image(image).await {
            Ok(i) => Ok(i.id),
            Err(e) if status_of(&e) == Some(404) => Ok(None),
            Err(e) => Err(DriverError::Docker(format!("inspect image {image}: {e}"))),
        }
    }

    /// Pulls `image`, sharing one pull among concurrent callers. The pull is abandoned when no
    /// progress arrives for `activity_timeout` or it takes longer than `timeout`.
    pub async fn pull(&self, docker: &Docker, image: &str, timeout: Duration, activity_timeout: Duration) -> Result<(), DriverError> {
        let pull = {
            let mut pulls = lock(&self.pulls);
            pulls
                .entry(image.to_string())
                .or_insert_with(|| {
                    let docker = docker.clone();
                    let image = image.to_string();
                    async move {
                        let options = CreateImageOptions { from_image: Some(image.clone()), ..Default::default() };
                        let run = async {
                            let mut progress = docker.create_image(Some(options), None, None);
                            loop {
                                match tokio::time::timeout(activity_timeout, progress.next()).await {
                                    Err(_) => return Err(format!("no pull progress for {activity_timeout:?}")),
                                    Ok(None) => return Ok(()),
                                    Ok(Some(Err(e))) => return Err(e.to_string()),
                                    Ok(Some(Ok(_))) => {}
                                }
                            }
                        };
                        tokio::time::timeout(timeout, run).await.unwrap_or_else(|_| Err(format!("pull exceeded {timeout:?}")))
                    }
                    .boxed()
                    .shared()
                })
                .clone()
        };
        let result = pull.await;
        lock(&self.pulls).remove(image);
        result.map_err(|reason| DriverError::ImageUnavailable(not_found_message(image, &reason)))
    }

    /// `docker load` of a tarball.
    pub async fn load(docker: &Docker, tarball: std::fs::File) -> Result<(), DriverError> {
        let file = tokio::fs::File::from_std(tarball);
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(file));
        let mut progress = docker.import_image(ImportImageOptions::default(), body, None);
        while let Some(item) = progress.next().await {
            item.map_err(|e| DriverError::ImageUnavailable(format!("docker load: {e}")))?;
        }
        Ok(())
    }

    /// One more task uses the image.
    pub fn acquire(&self, image_id: &str) {
        let mut refs = lock(&self.refs);
        let entry = refs.entry(image_id.to_string()).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += 1;
    }

    /// One task less; at zero, the image is removed after `delay` unless a task takes it again.
    pub fn release(self: &Arc<Self>, docker: &Docker, image_id: &str, delay: Duration) {
        let generation = {
            let mut refs = lock(&self.refs);
            let Some(entry) = refs.get_mut(image_id) else { return };
            entry.0 = entry.0.saturating_sub(1);
            if entry.0 > 0 {
                return;
            }
            entry.1
        };
        let images = self.clone();
        let docker = docker.clone();
        let image_id = image_id.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            {
                let mut refs = lock(&images.refs);
                match refs.get(&image_id) {
                    Some((0, g)) if *g == generation => {
                        refs.remove(&image_id);
                    }
                    _ => return,
                }
            }
            let options = RemoveImageOptions { force: true, ..Default::default() };
            match docker.remove_image(&image_id, Some(options), None).await {
                Ok(_) => tracing::info!(image = %image_id, "removed an unused docker image"),
                Err(e) => tracing::warn!(image = %image_id, error = %e, "removing an unused docker image"),
            }
        });
    }

    /// How many tasks use the image (tests).
    pub fn users(&self, image_id: &str) -> usize {
        lock(&self.refs).get(image_id).map(|e| e.0).unwrap_or(0)
    }
}
