package deploy

import (
	"fmt"
	"io/fs"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// secretFile is a file a container reads from a Secret volume.
type secretFile struct {
	// Volume is the pod volume the file is on.
	Volume *corev1.Volume
	// Secret and Key name the Secret and the key the file holds.
	Secret, Key string
	// Mode is the file's permission bits as the kubelet writes them.
	Mode fs.FileMode
	// Rel is the file's path under its mount.
	Rel string
	// Mount is where the volume is mounted in the container.
	Mount string
}

// resolveSecretFile finds which Secret key a file path in container c of
// w holds: the mount the path is under, the Secret volume behind it, and
// the key projected to that path (an item's path, or the key's own name
// when the volume projects every key). It errors when the file is on no
// mount, on a volume that is not a Secret, or at a path the volume does
// not project.
func resolveSecretFile(w *workload, c *corev1.Container, file string) (*secretFile, error) {
	var mount *corev1.VolumeMount
	for i, m := range c.VolumeMounts {
		if strings.HasPrefix(path.Clean(file), path.Clean(m.MountPath)+"/") &&
			(mount == nil || len(m.MountPath) > len(mount.MountPath)) {
			mount = &c.VolumeMounts[i]
		}
	}
	if mount == nil {
		return nil, fmt.Errorf("%s is on no volume mount of container %s", file, c.Name)
	}
	if mount.SubPath != "" || mount.SubPathExpr != "" {
		return nil, fmt.Errorf("%s is on a subPath mount; Secret updates do not reach subPath mounts", file)
	}
	var vol *corev1.Volume
	for i, v := range w.Template.Spec.Volumes {
		if v.Name == mount.Name {
			vol = &w.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret == nil {
		return nil, fmt.Errorf("%s is on volume %q, which is not a Secret volume", file, mount.Name)
	}
	rel := strings.TrimPrefix(path.Clean(file), path.Clean(mount.MountPath)+"/")
	mode := fs.FileMode(corev1.SecretVolumeSourceDefaultMode)
	if vol.Secret.DefaultMode != nil {
		mode = fs.FileMode(*vol.Secret.DefaultMode)
	}
	sf := &secretFile{Volume: vol, Secret: vol.Secret.SecretName, Rel: rel, Mount: mount.MountPath}
	if len(vol.Secret.Items) == 0 {
		sf.Key, sf.Mode = rel, mode
		return sf, nil
	}
	for _, item := range vol.Secret.Items {
		if path.Clean(item.Path) == rel {
			sf.Key, sf.Mode = item.Key, mode
			if item.Mode != nil {
				sf.Mode = fs.FileMode(*item.Mode)
			}
			return sf, nil
		}
	}
	return nil, fmt.Errorf("%s: volume %q projects no item at %s", file, mount.Name, rel)
}

// readableBy reports whether the container's process can read a file of
// the given mode on a Secret volume: the kubelet writes such files owned
// by root, group-owned by the pod's fsGroup when it has one.
func readableBy(w *workload, c *corev1.Container, mode fs.FileMode) bool {
	if mode&0o004 != 0 {
		return true
	}
	if mode&0o040 != 0 && w.Template.Spec.SecurityContext != nil && w.Template.Spec.SecurityContext.FSGroup != nil {
		return true
	}
	uid := int64(-1)
	if sc := w.Template.Spec.SecurityContext; sc != nil && sc.RunAsUser != nil {
		uid = *sc.RunAsUser
	}
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		uid = *c.SecurityContext.RunAsUser
	}
	return mode&0o400 != 0 && uid == 0
}
