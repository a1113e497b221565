// The sidebar plugin: one model that follows the notebook in focus, its view in the right sidebar,
// and a command that opens a rank's logs.

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { MainAreaWidget } from '@jupyterlab/apputils';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { LogView } from './logs';
import { MeshModel } from './model';
import { PdbPanel, StacksView } from './pdb';
import { MeshSidebar } from './view';
import { IMesh } from './wire';

const ICON_SVG =
  '<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 24 24"><g class="jp-icon3" fill="#616161">' +
  '<rect x="3" y="3" width="5" height="5" rx="1"/><rect x="10" y="3" width="5" height="5" rx="1"/>' +
  '<rect x="17" y="3" width="5" height="5" rx="1"/><rect x="3" y="10" width="5" height="5" rx="1"/>' +
  '<rect x="10" y="10" width="5" height="5" rx="1"/><rect x="17" y="10" width="5" height="5" rx="1"/>' +
  '<rect x="3" y="17" width="5" height="5" rx="1"/><rect x="10" y="17" width="5" height="5" rx="1"/>' +
  '<rect x="17" y="17" width="5" height="5" rx="1"/></g></svg>';

export const meshIcon = new LabIcon({ name: 'jupyter-mesh:mesh', svgstr: ICON_SVG });

export const sidebarPlugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-mesh:sidebar',
  description: 'The meshes of the focused notebook\'s kernel, live, with actions.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILabShell],
  activate: (app: JupyterFrontEnd, notebooks: INotebookTracker, labShell: ILabShell | null) => {
    const model = new MeshModel();
    // a tab in the bottom panel: beside the notebook, not squeezing it (a split halves its width)
    const existing = (id: string) => Array.from(app.shell.widgets('down')).find(w => w.id === `${id}-area`);
    const openBelow = (content: Widget): void => {
      const area = new MainAreaWidget({ content });
      area.id = `${content.id}-area`;
      area.title.label = content.title.label;
      area.title.icon = meshIcon;
      content.disposed.connect(() => area.dispose()); // a pdb console closes itself once its rank runs on
      app.shell.add(area, 'down');
      app.shell.activateById(area.id);
    };
    const openLogs = (mesh: IMesh, rank: number | null): void => {
      const content = new LogView(model, mesh, rank);
      const there = existing(content.id);
      if (there) {
        content.dispose();
        app.shell.activateById(there.id);
        return;
      }
      openBelow(content);
    };
    const openPdb = (mesh: IMesh, rank: number): void => {
      const there = existing(PdbPanel.idFor(mesh, rank));
      if (there) {
        app.shell.activateById(there.id);
        return;
      }
      openBelow(new PdbPanel(model, mesh, rank, text => sidebar.say(text)));
    };
    const openStacks = (mesh: IMesh): void => {
      const content = new StacksView(model, mesh);
      const there = existing(content.id);
      if (there) {
        content.dispose();
        app.shell.activateById(there.id);
        void ((there as MainAreaWidget<StacksView>).content.refresh());
        return;
      }
      openBelow(content);
    };
    const sidebar = new MeshSidebar(model, { openLogs, openPdb, openStacks });
    sidebar.title.icon = meshIcon;
    app.shell.add(sidebar, 'right', { rank: 600 });
    const follow = (panel: NotebookPanel | null): void => {
      model.follow(panel?.sessionContext ?? null, panel?.title.label ?? '');
    };
    notebooks.currentChanged.connect((_, panel) => follow(panel));
    follow(notebooks.currentWidget);
    if (labShell) {
      app.restored.then(() => labShell.expandRight()).catch(() => undefined);
    }
  }
};
