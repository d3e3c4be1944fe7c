package main

// The web console's volumes (web/console/src/volumes.js) in Chromium,
// on the security tests' shared world (as the Code tab's test,
// code_console_test.go): the Volumes page lists a volume with its use and
// the sandbox that mounts it, creates and deletes one; a volume's page
// browses its files and uploads one, which the mounting sandbox reads; the
// create dialog mounts volumes, and the sandbox's page lists its mounts.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/pandastack/pandastack/internal/testing/testkit"
	pandastack "github.com/pandastack/pandastack/sdk/go"
)

func TestVolumeConsole(t *testing.T) {
	w := security(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	c := w.client(t, w.AdminKey())
	suffix := make([]byte, 4)
	rand.Read(suffix)
	name := fmt.Sprintf("con-%x", suffix)
	vol, err := c.CreateVolume(ctx, name, 16)
	if err != nil {
		t.Fatalf("create volume: %v", err)
	}
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := c.DeleteVolume(kctx, vol.ID, true); err != nil && !errors.Is(err, pandastack.ErrNotFound) {
			t.Errorf("delete volume %s: %v", name, err)
		}
	})
	if _, err := c.VolumeFiles(name).WriteFile(ctx, "/docs/readme.txt", strings.NewReader("from the api\n"), 0); err != nil {
		t.Fatalf("write a file: %v", err)
	}
	b := newBrowserIn(t, 9*time.Minute, w.env.Host.Path)
	url := w.URL() + "/"
	b.signInAs(url, w.AdminKey())

	// A sandbox mounting it, created from the tree's dialog.
	b.run("open the create dialog", chromedp.Click(chromedp.CSS(`[data-testid=new-sandbox]`)), chromedp.WaitVisible(chromedp.CSS(`#f-volumes`)))
	b.input(`#f-metadata`, "volume-test="+name)
	b.input(`#f-volumes`, name+":/mnt/data")
	b.run("create", chromedp.Click(chromedp.CSS(`[data-testid=submit]`)))
	var sb *pandastack.Sandbox
	testkit.WaitFor(t, 3*time.Minute, "the sandbox created in the console", func() bool {
		l, err := c.List(ctx, pandastack.ListOptions{Metadata: map[string]string{"volume-test": name}})
		if err != nil || len(l) != 1 || l[0].Info.State != pandastack.StateRunning {
			return false
		}
		sb = l[0]
		return true
	})
	t.Cleanup(func() {
		kctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		sb.Kill(kctx)
	})
	if want := []pandastack.VolumeMount{{Name: name, Path: "/mnt/data"}}; len(sb.Info.Volumes) != 1 || sb.Info.Volumes[0] != want[0] {
		t.Errorf("the console's sandbox mounts %+v, want %+v", sb.Info.Volumes, want)
	}

	// The list: the volume, its use, the sandbox mounting it.
	b.run("the volumes page", chromedp.Click(chromedp.CSS(`[data-testid=nav-volumes]`)))
	row := `[data-testid=volume-` + name + `]`
	b.wait("the volume listed with its mount", `(() => {
		const r = document.querySelector(`+js(row)+`);
		return !!r && r.textContent.includes('of 16.0 MiB') && r.textContent.includes(`+js(sb.ID)+`);
	})()`, 30*time.Second)

	// Create one from the dialog, then delete it.
	other := name + "-x"
	b.run("open the create dialog", chromedp.Click(chromedp.CSS(`[data-testid=volume-create]`)), chromedp.WaitVisible(chromedp.CSS(`#f-name`)))
	b.input(`#f-name`, other)
	b.input(`#f-size_mib`, "8")
	b.run("create", chromedp.Click(chromedp.CSS(`[data-testid=submit]`)))
	otherRow := `[data-testid=volume-` + other + `]`
	b.wait("the new volume listed", `(document.querySelector(`+js(otherRow)+`)?.textContent || '').includes('of 8.0 MiB')`, 30*time.Second)
	if v, err := c.GetVolume(ctx, other); err != nil || v.SizeMiB != 8 {
		t.Errorf("the volume created in the console: got %+v, %v", v, err)
	}
	b.run("delete it", chromedp.Click(chromedp.CSS(otherRow+` button.danger`)), chromedp.WaitVisible(chromedp.CSS(`[data-testid=confirm]`)),
		chromedp.Click(chromedp.CSS(`[data-testid=confirm]`)))
	b.wait("the deleted volume gone", `!document.querySelector(`+js(otherRow)+`)`, 30*time.Second)
	if _, err := c.GetVolume(ctx, other); !errors.Is(err, pandastack.ErrNotFound) {
		t.Errorf("the volume deleted in the console: got %v, want not found", err)
	}

	// A volume's page: its files; an upload the sandbox reads.
	b.run("the volume's page", chromedp.Click(chromedp.CSS(row+` a`)))
	b.wait("its mount and files", `(document.querySelector('[data-testid=mounted-by]')?.textContent || '').includes(`+js(sb.ID)+`) &&
		!!document.querySelector('[data-testid="file-docs"]')`, 30*time.Second)
	b.run("open docs", chromedp.Click(chromedp.CSS(`[data-testid="file-docs"] button.link`)))
	b.wait("readme.txt in docs", `!!document.querySelector('[data-testid="file-readme.txt"]')`, 30*time.Second)
	upload := filepath.Join(t.TempDir(), "from-console.txt")
	if err := os.WriteFile(upload, []byte("uploaded to a volume\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	b.run("upload a file", chromedp.SetUploadFiles(chromedp.CSS(`[data-testid=upload]`), []string{upload}))
	b.wait("the uploaded file listed", `!!document.querySelector('[data-testid="file-from-console.txt"]')`, 30*time.Second)
	if got := mustExec(t, ctx, sb, "cat /mnt/data/docs/from-console.txt"); got != "uploaded to a volume\n" {
		t.Errorf("the sandbox reads %q from the uploaded file", got)
	}
	b.screenshot("console-volume")

	// The sandbox's page lists its mount, linked to the volume.
	b.run("the sandbox's page", chromedp.Navigate(url+"#/sandboxes/"+sb.ID))
	b.wait("its mount", `(document.querySelector('[data-testid=mounts]')?.textContent || '').includes(`+js(name+" at /mnt/data")+`)`, 30*time.Second)
	b.run("follow the mount's link", chromedp.Click(chromedp.CSS(`[data-testid=mount-`+name+`]`)))
	b.wait("the volume's page again", `document.querySelector('[data-testid=volume-page]')?.dataset.name === `+js(name), 30*time.Second)
}
