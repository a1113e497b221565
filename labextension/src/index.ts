import { JupyterFrontEndPlugin } from '@jupyterlab/application';

import { sidebarPlugin } from './plugin';

const plugins: JupyterFrontEndPlugin<any>[] = [sidebarPlugin];

export default plugins;
